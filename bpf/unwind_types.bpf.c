// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* The types of bpf/unwind.h, compiled once for pkg/unwind's Go bindings:
 * every object that includes the header (cuda, fd) has maps of these types,
 * and pkg/unwind reads and writes them for all. Nothing here is loaded. */
#include "unwind.h"
