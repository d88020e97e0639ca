#!/usr/bin/env bash
# gpu-check: a self-contained check (under 5 minutes) for a machine with an
# NVIDIA GPU and driver. It builds a small program that loads the real CUDA
# runtime and holds COUNT x MiB of device memory from hold_weights(), watches
# it with `autoglm-ebpf attach`, and compares our live bytes with what we
# allocated and with NVML's per-process figure (which adds the CUDA context).
# The program keeps the GPU busy while it holds the memory (cudaMemset over
# every block): the per-process utilization we report is printed next to
# what `nvidia-smi pmon` saw for the same pid at the same time.
#
# Then, where PyTorch with CUDA is installed (PYTHON, default python3), a
# real PyTorch loop (testdata/python/torchleak.py) leaks device memory
# from one line through the caching allocator: the run must report a
# gpu_memory_leak whose stack names that line, and the HTML report is
# written next to the JSON one (OUT). And a real PyTorch training loop
# (testdata/python/torchsync.py) runs twice, with a .item() per step and
# with the loss kept on the device: the first must make a gpu_sync_storm
# naming the .item() line, the second none; each run's findings and
# verdicts (cuda.verdict, cuda.verdict_host) are printed next to the SM
# utilization `nvidia-smi pmon` saw for its pid.
#
# A GPU box without Go or gcc (the device machine) runs the binary and
# fixture built beforehand: bin/autoglm-ebpf and testdata/bin/gpuhold.
#
# usage: sudo scripts/gpu-check.sh [LIBCUDART]
#   LIBCUDART defaults to the first libcudart.so* found by ldconfig or under
#   a PyTorch/pip install (site-packages/nvidia/cuda_runtime/lib).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-16}
MIB=${MIB:-64}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"

lib=${1:-}
if [ -z "$lib" ]; then
	lib=$(ldconfig -p | awk '/libcudart\.so/ {print $NF; exit}')
fi
if [ -z "$lib" ]; then
	lib=$(find / -path /proc -prune -o -name 'libcudart.so*' -print 2>/dev/null | head -1)
fi
[ -n "$lib" ] || { echo "gpu-check: no libcudart.so found; pass its path" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true

if command -v go >/dev/null; then
	make -s build
fi
[ -x bin/autoglm-ebpf ] || { echo "gpu-check: no bin/autoglm-ebpf and no Go to build it" >&2; exit 1; }
if command -v gcc >/dev/null; then
	gcc -O1 -g -fno-omit-frame-pointer -o "$out/gpuhold" testdata/gpuhold.c
else
	cp testdata/bin/gpuhold "$out/gpuhold"
fi
# Keep the runtime dlopen'ed after attach starts: gpuhold waits 3 s before
# allocating, so this also checks that a late-loaded runtime is hooked.
GPUHOLD_BUSY=1 "$out/gpuhold" "$lib" "$COUNT" "$MIB" 25 >"$out/gpuhold.log" 2>&1 &
pid=$!
trap 'kill $pid $pmon 2>/dev/null || true' EXIT
pmon=
if command -v nvidia-smi >/dev/null; then
	# One line per process and second: gpu, pid, type, sm %, mem %, ...
	nvidia-smi pmon -s u -d 1 -c 15 >"$out/pmon.log" 2>&1 &
	pmon=$!
fi
./bin/autoglm-ebpf attach --pid "$pid" --duration 15s --json "$out/report.json" >"$out/attach.log" 2>&1 || true
cat "$out/attach.log" | tail -20
[ -z "$pmon" ] || wait "$pmon" || true

held=0
python3 - "$out/report.json" "$COUNT" "$MIB" "$out/pmon.log" "$pid" <<'PY' || held=$?
import json, os, sys
r = json.load(open(sys.argv[1]))
want = int(sys.argv[2]) * int(sys.argv[3]) << 20
p = r["processes"][0]
cuda = p.get("cuda") or {}
live = cuda.get("live_bytes", 0)
nvml = cuda.get("nvml_used_bytes")
print(f"allocated {want} B; eBPF live {live} B; NVML used {nvml} B; untracked {cuda.get('untracked_bytes')} B")
print("libraries:", cuda.get("libraries"))
print("gpus:", r.get("gpus"))
# Per-process utilization: ours (the last interval, and the history's mean)
# next to nvidia-smi pmon's for the same pid.
hist = ((p.get("history") or {}).get("series") or {}).get("gpu_sm_utilization_ratio") or {}
ours = [v for v in (hist.get("last") or []) if v is not None]
print("ours, last interval:", cuda.get("gpu_utilization"))
if ours:
    print(f"ours, SM utilization over the run: mean {100*sum(ours)/len(ours):.0f} %, max {100*max(ours):.0f} %")
pmon = []
if os.path.exists(sys.argv[4]):
    for line in open(sys.argv[4]):
        f = line.split()
        if len(f) > 4 and f[1] == sys.argv[5] and f[3].isdigit():
            pmon.append(int(f[3]))
if pmon:
    print(f"nvidia-smi pmon, SM utilization of pid {sys.argv[5]}: mean {sum(pmon)/len(pmon):.0f} %, max {max(pmon)} % ({len(pmon)} samples)")
ok = live == want
if nvml is not None:
    ok = ok and nvml >= live
print("gpu-check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY

py=${PYTHON:-python3}
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	echo "gpu-check: no PyTorch with CUDA for $py; the PyTorch part is skipped"
	exit $held
fi
./bin/autoglm-ebpf run --json "$out/torch.json" --html "$out/torch.html" --pprof "$out/pprof" -- \
	"$py" testdata/python/torchleak.py 50 >"$out/torch.log" 2>&1 || true
tail -5 "$out/torch.log"
torch=0
"$py" - "$out/torch.json" testdata/python/torchleak.py <<'PY' || torch=$?
import json, sys
r = json.load(open(sys.argv[1]))
line = next(i for i, l in enumerate(open(sys.argv[2]), 1) if "# alloc: leak" in l)
leaks = [f for f in r["findings"] if f["kind"] == "gpu_memory_leak"]
for f in r["findings"]:
    print(f"{f['kind']} ({f['severity']}): {f['summary']}")
named = [f for f in leaks if any(fr.get("kind") == "python" and fr.get("function") == "cache_activations" and fr.get("line") == line for fr in f.get("stack") or [])]
if leaks:
    print("leak stack:", [fr.get("function") for fr in leaks[0].get("stack") or []][:12])
ok = bool(named)
print(f"gpu-check (PyTorch): gpu_memory_leak naming cache_activations (torchleak.py:{line}):", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY

# The host's waits on the GPU: the same loop with a .item() per step and
# without, 40 s each (the verdict's window is 30 s).
sync=0
for mode in item device; do
	pmon=
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi pmon -s u -d 1 -c 42 >"$out/sync-$mode.pmon" 2>&1 &
		pmon=$!
	fi
	./bin/autoglm-ebpf run --json "$out/sync-$mode.json" -- \
		"$py" testdata/python/torchsync.py "$mode" 40 >"$out/sync-$mode.log" 2>&1 || true
	[ -z "$pmon" ] || wait "$pmon" || true
	tail -3 "$out/sync-$mode.log"
	"$py" - "$out/sync-$mode.json" "$out/sync-$mode.pmon" testdata/python/torchsync.py "$mode" <<'PY' || sync=1
import json, os, sys
r = json.load(open(sys.argv[1]))
pmon_log, script, mode = sys.argv[2:5]
line = next(i for i, l in enumerate(open(script), 1) if "# sync: item" in l)
print(f"--- torchsync.py {mode}")
for p in r["processes"]:
    c = p.get("cuda") or {}
    print(f"pid {p['pid']} ({p['comm']}): verdict {c.get('verdict') or '(none)'}, host side {c.get('verdict_host')}, "
          f"our utilization (last interval) {c.get('gpu_utilization')}")
pids = {str(p["pid"]) for p in r["processes"]}
sm = []
if os.path.exists(pmon_log):
    for l in open(pmon_log):
        f = l.split()
        if len(f) > 4 and f[1] in pids and f[3].isdigit():
            sm.append(int(f[3]))
if sm:
    print(f"nvidia-smi pmon, SM utilization: mean {sum(sm)/len(sm):.0f} %, max {max(sm)} % ({len(sm)} samples)")
else:
    print("nvidia-smi pmon: no samples for", sorted(pids))
for f in r["findings"]:
    print(f"{f['kind']} ({f['severity']}): {f['summary']}")
storms = [f for f in r["findings"] if f["kind"] == "gpu_sync_storm"]
if mode == "item":
    ok = any(fr.get("kind") == "python" and fr.get("function") == "train" and fr.get("line") == line
             for f in storms for fr in f.get("stack") or [])
    want = f"a gpu_sync_storm naming train (torchsync.py:{line})"
else:
    ok, want = not storms, "no gpu_sync_storm"
print(f"gpu-check (PyTorch, {mode}): {want}:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
done
[ "$held" = 0 ] && [ "$torch" = 0 ] && [ "$sync" = 0 ]
