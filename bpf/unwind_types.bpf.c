// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* The types of bpf/unwind.h, compiled once for pkg/unwind's Go bindings:
 * pkg/stacks creates the maps of these types once (bpf/stacks.bpf.c) for
 * every object that includes the header (cuda, fd), and pkg/unwind reads
 * and writes them. Nothing here is loaded. */
#include "unwind.h"
