#!/usr/bin/env bash
# make bench: overhead benchmarks, each measured side by side in one run
# (untraced and traced runs alternate). Needs root. Results: BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'FDOverhead' -benchtime 1x -timeout 30m ./pkg/fdtrack/
for s in scripts/bench-*.sh; do
	[ -x "$s" ] && "$s"
done
# The node-wide daemon: RSS and CPU idle among ~1000 processes and with 20
# CUDA processes at 500 allocations/s each; discovery latency.
go test -count=1 -run '^$' -bench 'BenchmarkDaemon$' -benchtime 1x -timeout 10m ./cmd/autoglm-ebpf/
# Its CPU under ~100 process starts a second, with and without a process
# holding 15 000 fds (--all and the default mode).
go test -count=1 -run '^$' -bench 'BenchmarkDaemonChurn$' -benchtime 1x -timeout 30m ./cmd/autoglm-ebpf/
# Beside a process holding 10 000 fds that forks 5 children a second, each
# inheriting every fd, against the same process forking none (issue 35).
go test -count=1 -run '^$' -bench 'BenchmarkDaemonFork$' -benchtime 1x -timeout 20m ./cmd/autoglm-ebpf/
# The fd view's unwinding with 1 and 32 Python processes of one interpreter
# doing the same opens: rules, their memory, requests and CPU (AUTOGLM_BENCH_BIN
# measures another build's agent alike).
go test -count=1 -run '^$' -bench 'BenchmarkUnwindByFile$' -benchtime 1x -timeout 20m ./cmd/autoglm-ebpf/
# A soak of AUTOGLM_SOAK (30m) whose CPU and RSS per minute must stay flat.
go test -count=1 -run '^$' -bench 'BenchmarkDaemonSoak$' -benchtime 1x -timeout 90m ./cmd/autoglm-ebpf/
# A soak of AUTOGLM_FORK_SOAK (20m) with a leaking, forking shell-like
# process and a process holding 15 000 fds among the churn (issue 35).
go test -count=1 -run '^$' -bench 'BenchmarkDaemonForkSoak$' -benchtime 1x -timeout 40m ./cmd/autoglm-ebpf/
