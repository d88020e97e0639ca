#!/usr/bin/env bash
# bench-many: N processes (default 5000) in one cgroup under a daemon that
# watches every process of it at --max-processes CAP (default N): how long
# until all are watched, what was counted over the cap, lost or refused,
# and the daemon's memory, CPU, BPF memory and series at that size.
# Root; about two minutes at 5000 on a 2-core VM. Figures: BENCHMARKS.md.
#
# usage: sudo N=5000 CAP=5000 scripts/bench-many.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
CAP=${CAP:-$N}
WINDOW=${WINDOW:-30}
root=/sys/fs/cgroup/unified
[ -f $root/cgroup.controllers ] || root=/sys/fs/cgroup
cg=$root/autoglm-bench-many-$$
mkdir "$cg"
port=$((20000 + $$ % 10000))
make -s build
./bin/autoglm-ebpf daemon --all --match-cgroup "*autoglm-bench-many*" --max-processes "$CAP" \
	--web.listen-address "127.0.0.1:$port" >/tmp/bench-many-daemon.log 2>&1 &
daemon=$!
spawner=
cleanup() {
	[ -z "$spawner" ] || kill "$spawner" 2>/dev/null || true
	# Everything left in the cgroup: the sleepers.
	xargs -r kill -9 <"$cg/cgroup.procs" 2>/dev/null || true
	kill -TERM "$daemon" 2>/dev/null && wait "$daemon" || true
	for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
}
trap cleanup EXIT
for _ in $(seq 200); do curl -sf "127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
metric() { curl -s "127.0.0.1:$port/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s+=$2} END {print s+0}'; }
t0=$(date +%s.%N)
sh -c "echo \$\$ > $cg/cgroup.procs; for i in \$(seq $N); do sleep 3600 & done; wait" &
spawner=$!
want=$((N < CAP ? N : CAP))
for _ in $(seq 600); do
	w=$(metric autoglm_watched_processes)
	[ "${w%.*}" -ge "$want" ] && break
	sleep 1
done
t1=$(date +%s.%N)
echo "N=$N CAP=$CAP: $w watched after $(echo "$t1 - $t0" | bc) s (spawning included)"
cpu0=$(metric process_cpu_seconds_total)
sleep "$WINDOW" # measurement window: steady polls at this size
cpu1=$(metric process_cpu_seconds_total)
echo "daemon CPU over ${WINDOW} s at that size: $(echo "scale=1; 100 * ($cpu1 - $cpu0) / $WINDOW" | bc) % of a core"
curl -s "127.0.0.1:$port/metrics" | grep -E '^(autoglm_processes_over_cap_total|autoglm_track_failures_total|autoglm_bpf_events_lost_total|autoglm_bpf_memory_bytes|process_resident_memory_bytes|autoglm_watched_processes)' | grep -v ' 0$' || true
echo "series on /metrics: $(curl -s "127.0.0.1:$port/metrics" | grep -vc '^#')"
