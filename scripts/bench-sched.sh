#!/usr/bin/env bash
# Overhead of the sched concern on a 4-pair pipe ping-pong (the worst case
# for a sched_switch hook), as a ratio of the workload's own throughput:
# untraced, traced, tracker loaded but not tracking it, and a bpftrace
# one-liner counting the same sched_switch events, runs alternating in one
# run. Needs root. Installs bpftrace (Debian package) for the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bpftrace >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bpftrace >/dev/null ||
			echo "bpftrace could not be installed: running without the comparison" >&2
	else
		echo "bpftrace missing: running without the comparison" >&2
	fi
fi
go test -run '^$' -bench 'SchedOverhead' -benchtime 1x -timeout 30m ./pkg/schedtrack/
