#!/usr/bin/env bash
# gpu-check: a self-contained check (under 5 minutes) for a machine with an
# NVIDIA GPU and driver. It builds a small program that loads the real CUDA
# runtime and holds COUNT x MiB of device memory from hold_weights(), watches
# it with `autoglm-ebpf attach`, and compares our live bytes with what we
# allocated and with NVML's per-process figure (which adds the CUDA context).
#
# usage: sudo scripts/gpu-check.sh [LIBCUDART]
#   LIBCUDART defaults to the first libcudart.so* found by ldconfig or under
#   a PyTorch/pip install (site-packages/nvidia/cuda_runtime/lib).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-16}
MIB=${MIB:-64}
out=${OUT:-$(mktemp -d)}

lib=${1:-}
if [ -z "$lib" ]; then
	lib=$(ldconfig -p | awk '/libcudart\.so/ {print $NF; exit}')
fi
if [ -z "$lib" ]; then
	lib=$(find / -path /proc -prune -o -name 'libcudart.so*' -print 2>/dev/null | head -1)
fi
[ -n "$lib" ] || { echo "gpu-check: no libcudart.so found; pass its path" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true

make -s build
gcc -O1 -g -fno-omit-frame-pointer -o "$out/gpuhold" testdata/gpuhold.c
# Keep the runtime dlopen'ed after attach starts: gpuhold waits 3 s before
# allocating, so this also checks that a late-loaded runtime is hooked.
"$out/gpuhold" "$lib" "$COUNT" "$MIB" 25 >"$out/gpuhold.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
./bin/autoglm-ebpf attach --pid "$pid" --duration 15s --json "$out/report.json" >"$out/attach.log" 2>&1 || true
cat "$out/attach.log" | tail -20

python3 - "$out/report.json" "$COUNT" "$MIB" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = int(sys.argv[2]) * int(sys.argv[3]) << 20
p = r["processes"][0]
cuda = p.get("cuda") or {}
live = cuda.get("live_bytes", 0)
nvml = cuda.get("nvml_used_bytes")
print(f"allocated {want} B; eBPF live {live} B; NVML used {nvml} B; untracked {cuda.get('untracked_bytes')} B")
print("libraries:", cuda.get("libraries"))
print("gpus:", r.get("gpus"))
ok = live == want
if nvml is not None:
    ok = ok and nvml >= live
print("gpu-check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
