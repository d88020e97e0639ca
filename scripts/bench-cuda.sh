#!/usr/bin/env bash
# CUDA hook cost (needs root): one cudaMalloc+cudaFree pair on the stand-in
# libraries without hooks, with empty uprobe+uretprobe programs on the same
# functions, and with our hooks; the hooked/empty ratio is the cost of our
# BPF programs over the bare probes (target <= 1.10). Then the sustained run:
# 100k allocations/s (CUDA_BENCH_RATE) for 10 s, with the rate reached and
# the losses.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
pairs=${CUDA_BENCH_PAIRS:-200000}
count=${CUDA_BENCH_COUNT:-5}

out=$(go test -count=1 -run '^$' -bench 'BenchmarkAllocFree' -benchtime="${pairs}x" -count="$count" ./pkg/cudatrack)
echo "$out" | grep -E '^Benchmark'
# Median ns/pair of each setup, then the ratio.
echo "$out" | awk '
/^BenchmarkAllocFree\// {
	split($1, a, "/"); name = a[2]; sub(/-[0-9]+$/, "", name)
	for (i = 2; i < NF; i++) if ($(i+1) == "ns/pair") v[name, ++n[name]] = $i
}
function median(name,   i, j, t, k) {
	k = n[name]
	for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[name, j] < v[name, i]) { t = v[name, i]; v[name, i] = v[name, j]; v[name, j] = t }
	return k % 2 ? v[name, (k + 1) / 2] : (v[name, k / 2] + v[name, k / 2 + 1]) / 2
}
END {
	u = median("unhooked"); e = median("empty"); h = median("hooked")
	printf "median ns per cudaMalloc+cudaFree: unhooked %.0f, empty probes %.0f, our hooks %.0f\n", u, e, h
	printf "hooked/empty ratio: %.3f (target <= 1.10)\n", h / e
}'

go test -count=1 -run '^$' -bench 'BenchmarkSustained' -benchtime=1x ./pkg/cudatrack | grep -E '^Benchmark|ok|FAIL'
