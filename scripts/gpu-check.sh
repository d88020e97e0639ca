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
# utilization `nvidia-smi pmon` saw for its pid. Last, a real PyTorch
# out-of-memory (testdata/python/torchoom.py: tensors kept from two
# functions until torch raises OutOfMemoryError): the run's
# gpu_alloc_failure must carry a memory snapshot whose live bytes and
# sites match what the script says it allocated (and
# torch.cuda.memory_summary(), printed by the same script), side by side.
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

# A real out-of-memory: the snapshot at the failed cudaMalloc against what
# the script allocated.
./bin/autoglm-ebpf run --json "$out/oom.json" --pprof "$out/pprof-oom" -- \
	"$py" testdata/python/torchoom.py >"$out/oom.log" 2>&1 || true
sed -n '/^|====/,/^OOM /p' "$out/oom.log"
oom=0
"$py" - "$out/oom.json" "$out/oom.log" "$out/pprof-oom" <<'PY' || oom=$?
import json, os, sys
r = json.load(open(sys.argv[1]))
lines = [l for l in open(sys.argv[2]) if l.startswith("OOM ")]
if not lines:
    print("gpu-check (PyTorch OOM): the script did not reach its OutOfMemoryError; FAIL")
    sys.exit(1)
ours = json.loads(lines[0][4:])
fails = [f for f in r["findings"] if f["kind"] == "gpu_alloc_failure"]
for f in fails:
    print(f"{f['kind']} ({f['severity']}): {f['summary']}")
snap = next((f["evidence"]["snapshot"] for f in fails if f["evidence"].get("snapshot")), None)
if snap is None:
    print("gpu-check (PyTorch OOM): no gpu_alloc_failure with a snapshot; FAIL")
    sys.exit(1)
# The snapshot's bytes by the Python function that allocated them.
theirs = dict.fromkeys(ours["by_function"], 0)
for site in snap["sites"]:
    fns = {fr.get("function") for fr in site.get("stack") or [] if fr.get("kind") == "python"}
    for fn in theirs:
        if fn in fns:
            theirs[fn] += site["bytes"]
gib = 1 << 30
def g(v):
    return "null" if v is None else f"{v / gib:.3f} GiB"
# What the snapshot says, what the script says (blank: nothing to compare).
rows = [("live at the failure", g(snap["live_bytes"]), g(ours["reserved_bytes"]), "torch reserved"),
        ("", "", g(ours["allocated_bytes"]), "torch allocated"),
        ("size that failed", g(snap["size_bytes"]), g(ours["failed_size_bytes"]), "torch's request")]
rows += [(f"at {fn}", g(theirs[fn]), g(ours["by_function"][fn]), f"{fn} kept") for fn in theirs]
rows += [("NVML for the process", g(snap.get("nvml_used_bytes")), "", ""), ("gap (NVML - hooked)", g(snap.get("gap_bytes")), "", "")]
print(f"{'':>22} {'snapshot':>12}   {'script':>12}")
for name, a, b, what in rows:
    print(f"{name:>22} {a:>12}   {b:>12} {what}")
print(f"why {snap['why']}, api {snap['api']}, error {snap['error']}, {snap['live_allocations']} live allocations "
      f"({ours['tensors']} tensors kept), {len(snap['history'])} history points, freed after {snap['freed_after_bytes']} B, "
      f"missed frees {snap['missed_frees']}, profile {snap.get('profile')!r}")
for d in snap.get("devices") or []:
    print(f"device {d['index']}{'' if d.get('mig') is None else '/mig' + str(d['mig'])} {d['name']}: {g(d['memory_used_bytes'])} of {g(d['memory_total_bytes'])}")
    for p in d["processes"]:
        print(f"  pid {p['pid']} {p.get('comm', '')}: {g(p['used_bytes'])} per NVML, live {g(p.get('live_bytes'))}"
              f"{' (self)' if p['self'] else ''}{' watched' if p['watched'] else ''}")
if os.path.isdir(sys.argv[3]):
    print("pprof files:", sorted(f for f in os.listdir(sys.argv[3]) if "gpu-oom" in f))
ok = (snap["why"] == "out_of_memory" and snap["live_bytes"] == ours["reserved_bytes"]
      and theirs == ours["by_function"] and snap["size_bytes"] == ours["failed_size_bytes"])
print("gpu-check (PyTorch OOM): snapshot live bytes and sites match the script's:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
[ "$held" = 0 ] && [ "$torch" = 0 ] && [ "$sync" = 0 ] && [ "$oom" = 0 ]
