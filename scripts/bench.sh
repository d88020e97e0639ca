#!/usr/bin/env bash
# make bench: overhead benchmarks, each measured side by side in one run
# (untraced and traced runs alternate). Needs root. Results: BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench 'FDOverhead' -benchtime 1x -timeout 30m ./pkg/fdtrack/
for s in scripts/bench-*.sh; do
	[ -x "$s" ] && "$s"
done
