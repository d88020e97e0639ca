// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* The maps of the one stack service (pkg/stacks): native stacks and their
 * unwind rules (unwind.h), Python frames (pyframes.h), and the types of the
 * per-site counters (sites.h). pkg/stacks creates the stack and Python maps
 * once from this object's spec and every object that captures stacks (fd,
 * cuda) is loaded with them in place of its own copies, so that a stack id
 * means the same call site in each. Each object keeps its own sites table
 * (fds and bytes do not mix) and scratch space. No program here is loaded. */
#include "common.h"
#include "pyframes.h"
#include "sites.h"
#include "unwind.h"

const struct site_key *unused_site_key __attribute__((unused));
const struct site_counts *unused_site_counts __attribute__((unused));
const struct site_owner_key *unused_site_owner_key __attribute__((unused));
const enum site_owner_count *unused_site_owner_count __attribute__((unused));
