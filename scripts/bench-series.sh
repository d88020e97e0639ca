#!/usr/bin/env bash
# bench-series: the daemon's series budget (issue 30). C cgroups (default
# 32; outside Kubernetes a cgroup is a container's unit) of P processes each
# (default 8: idle stand-ins), L of them (default 5) with an fd leaker among
# them, under a daemon at --max-processes C*P: the series on /metrics once
# every leak is a finding, split into per-container, per-process and the
# rest, with the daemon's CPU and RSS; then the same with
# --metrics.granularity=process beside it. Root; about three minutes on a
# 2-core VM. Figures: BENCHMARKS.md.
#
# usage: sudo scripts/bench-series.sh            (C=32 P=8 L=5)
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-32}
P=${P:-8}
L=${L:-5}
WINDOW=${WINDOW:-20}
root=/sys/fs/cgroup/unified
[ -f $root/cgroup.controllers ] || root=/sys/fs/cgroup
base=$root/autoglm-bench-series-$$
make -s build fixtures
fdwork=$PWD/testdata/bin/fdwork
daemon=
cleanup() {
	for cg in "$base"/c[0-9]*; do
		[ -d "$cg" ] || continue
		xargs -r kill -9 <"$cg/cgroup.procs" 2>/dev/null || true
	done
	[ -z "$daemon" ] || { kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true; }
	for cg in "$base"/c[0-9]*; do
		for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
	done
	rmdir "$base" 2>/dev/null || true
}
trap cleanup EXIT
trap "exit 1" INT TERM # so that EXIT runs
mkdir "$base"
# The processes first, so that both daemons find the same node.
for c in $(seq "$C"); do
	mkdir "$base/c$c"
	leak=$((c <= L))
	# P processes: the shell starts P-1 sleepers and becomes the last
	# process itself (the leaker, or one more sleeper).
	sh -c "echo \$\$ > $base/c$c/cgroup.procs
		for i in \$(seq $((P - 1))); do sleep 3600 & done
		ulimit -n \$(ulimit -Hn)
		[ $leak = 1 ] && exec $fdwork leak 2 3600 >/dev/null
		exec sleep 3600" &
	disown # killed with their cgroup at the end, without a job report each
done
port=$((20000 + $$ % 10000))
metrics() { curl -s "127.0.0.1:$port/metrics"; }
run() { # granularity
	./bin/autoglm-ebpf daemon --all --match-cgroup "*autoglm-bench-series-$$*" --max-processes $((C * P)) \
		--metrics.granularity "$1" --web.listen-address "127.0.0.1:$port" >/tmp/bench-series-daemon.log 2>&1 &
	daemon=$!
	for _ in $(seq 200); do curl -sf "127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
	# Every leak a finding (the fd_leak detector's window), every process watched.
	for _ in $(seq 300); do
		found=$(metrics | awk '$1 ~ /^autoglm_finding{/ && $2 > 0 {n++} END {print n+0}')
		watched=$(metrics | awk '$1 == "autoglm_watched_processes" {print $2+0}')
		[ "$found" -ge "$L" ] && [ "${watched:-0}" -ge $((C * P)) ] && break
		sleep 1
	done
	cpu0=$(metrics | awk '$1 == "process_cpu_seconds_total" {print $2}')
	sleep "$WINDOW"
	m=$(metrics | grep -v '^#')
	cpu1=$(echo "$m" | awk '$1 == "process_cpu_seconds_total" {print $2}')
	total=$(echo "$m" | wc -l)
	unit=$(echo "$m" | grep -c '^autoglm_container_' || true)
	own=$(echo "$m" | grep -v '^autoglm_container_' | grep -c 'pid="' || true)
	echo "granularity=$1: $watched watched, $found findings active; $total series: $unit per-container, $own per-process, $((total - unit - own)) node and agent;" \
		"CPU $(echo "scale=1; 100 * ($cpu1 - $cpu0) / $WINDOW" | bc) % of a core," \
		"RSS $(echo "$m" | awk '$1 == "process_resident_memory_bytes" {printf "%.0f", $2 / 1048576}') MiB"
	kill -TERM "$daemon" && wait "$daemon" || true
	daemon=
}
run container
run process
