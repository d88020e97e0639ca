#!/usr/bin/env bash
# CUDA hook cost (needs root): one cudaMalloc+cudaFree pair, and one
# cudaStreamSynchronize (the stand-in's GPU wait set to 0), on the stand-in
# libraries without hooks, with empty uprobe+uretprobe programs on the same
# functions (and empty entry programs only, and empty session programs),
# and with our hooks on each attach path: classic uprobe+uretprobe pairs and
# session uprobes (Linux 6.13+), for a tracked caller and an untracked one,
# and classic pairs with the caller's memory snapshot open (every free
# copying its block, against classic: the cost at a failure).
# Each against the empty pair is the cost of our hooks over the bare probes
# (target <= 1.25); an untracked caller's against the empty entries. The
# setups run in turn, CUDA_BENCH_COUNT rounds. Then the sustained run:
# 100k allocations/s (CUDA_BENCH_RATE) for 10 s, with the rate reached and
# the losses.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
pairs=${CUDA_BENCH_PAIRS:-200000}
count=${CUDA_BENCH_COUNT:-5}

# Rounds of every setup in turn (go test's -count would run each setup's
# runs back to back): a machine that slows down for a while slows all alike.
go test -c -o bin/cudatrack.test ./pkg/cudatrack
for bench in AllocFree:pair Sync:sync; do
	name=${bench%:*} unit=${bench#*:}
	out=$(cd pkg/cudatrack && for _ in $(seq "$count"); do ../../bin/cudatrack.test -test.run '^$' -test.bench "Benchmark$name\$" -test.benchtime="${pairs}x"; done)
	echo "$out" | grep -E '^Benchmark'
	# Median ns per call of each setup, then the ratio.
	echo "$out" | awk -v bench="Benchmark$name" -v unit="$unit" '
	index($1, bench "/") == 1 {
		split($1, a, "/"); name = a[2]; sub(/-[0-9]+$/, "", name)
		for (i = 2; i < NF; i++) if ($(i+1) == "ns/" unit) v[name, ++n[name]] = $i
	}
	function median(name,   i, j, t, k) {
		k = n[name]
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[name, j] < v[name, i]) { t = v[name, i]; v[name, i] = v[name, j]; v[name, j] = t }
		return k % 2 ? v[name, (k + 1) / 2] : (v[name, k / 2] + v[name, k / 2 + 1]) / 2
	}
	END {
		e = median("empty"); ee = median("empty-entry")
		printf "%s: median ns per %s:\n", bench, unit
		split("unhooked empty empty-entry empty-session classic session untracked-classic untracked-session snapshot-open-classic", names, " ")
		for (i = 1; i <= 9; i++) if (n[names[i]]) printf "  %-21s %6.0f\n", names[i], median(names[i])
		for (i = 5; i <= 6; i++) if (n[names[i]]) printf "%s/empty pair: %.3f (target <= 1.25)\n", names[i], median(names[i]) / e
		for (i = 7; i <= 8; i++) if (n[names[i]]) printf "%s/empty pair: %.3f, /empty entries: %.3f\n", names[i], median(names[i]) / e, median(names[i]) / ee
		if (n[names[9]] && n[names[5]]) printf "%s/classic: %.3f\n", names[9], median(names[9]) / median(names[5])
	}'
done

go test -count=1 -run '^$' -bench 'BenchmarkSustained' -benchtime=1x ./pkg/cudatrack | grep -E '^Benchmark|ok|FAIL'
