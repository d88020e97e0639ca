#!/usr/bin/env bash
# Runs inside a scripts/kernels.sh guest, as root, from the repository (the
# host's, read-only): `check`, then each workload under `run` with its JSON
# report's findings asserted. It also runs on any machine as
#   scripts/kernel-guest.sh OUT [STEP...]
# OUT gets a line per step in OUT/results ("STEP PASS|FAIL [WHY[ ;; WHY]]"),
# each step's output and report, and dmesg. Every step runs whatever an
# earlier one did: the host decides what must pass. Only lines starting
# with "kernel-guest:" go to the console, which the host scans for kernel
# WARNs.
set -euo pipefail

out=${1:?usage: kernel-guest.sh OUT [STEP...]}
shift
cd "$(dirname "$0")/.."
repo=$PWD
tool=$repo/bin/autoglm-ebpf
fix=$repo/testdata/bin
tests=$repo/bin
if [ "$(uname -m)" = aarch64 ]; then
	# Cross-built by make kernels-arm64; the test binaries take the
	# prebuilt fixtures (pkg/testutil), there being no compiler here.
	tool=$repo/bin/arm64/autoglm-ebpf
	fix=$repo/testdata/bin-arm64
	tests=$repo/bin/arm64
	export AUTOGLM_TEST_FIXTURES=$fix
fi
python=/usr/bin/python3.11
# A step that hangs must not take the others with it: loading every view
# takes up to a minute on an emulated CPU, the workloads at most 30 s.
limit=240
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(check fd fork cuda oomsnap gpuleak nccl ncclstall sched sock python eustack)
mkdir -p "$out"
: >"$out/results"

say() { echo "kernel-guest: $*"; }

# condense: an error of the tool (stdin; slog's escaped newlines too) as
# one line. Verifier logs are cut to the function being validated and the
# refusal, the line before "processed N insns"; the whole log stays in the
# step's output.
condense() {
	sed 's/\\n/\n/g; s/\\t/\t/g' | awk '
		/^[ \t]+processed [0-9]+ insns/ {
			if (last != "") out = out " [" fn last "]"
			sub(/^[ \t]+processed [0-9]+ insns \(limit [0-9]+\)( [a-z_]+ [0-9]+)*/, "")
			out = out $0
			last = fn = ""
			next
		}
		/^[ \t]/ {
			sub(/^[ \t]+/, "")
			if (sub(/^Validating /, "")) {
				sub(/ func#[0-9]+\.\.\.$/, "")
				fn = $0 ": "
			} else if ($0 !~ /^(verification time|stack depth)/) {
				last = $0
			}
			next
		}
		{ out = out (out == "" ? "" : " ") $0 }
		END {
			if (last != "") out = out " [" fn last "]"
			gsub(/  +/, "  ", out)
			print out
		}'
}

# why collects the reasons a step failed; a step passes with none.
why=()
fail() { why+=("$*"); }

# tool_run STEP [RUN FLAGS] -- CMD...: the tool's run, its report in
# OUT/STEP.json and its output in OUT/STEP.log; a failed run is a reason
# given in the tool's own words.
tool_run() {
	local step=$1 rc=0
	shift
	timeout -k 10 "$limit" "$tool" run --json "$out/$step.json" "$@" >"$out/$step.log" 2>&1 || rc=$?
	if [ $rc -eq 124 ]; then
		fail "run still going after $limit s"
	elif [ $rc -ne 0 ]; then
		fail "run exit $rc: $(sed -n '/^autoglm-ebpf: /,$p' "$out/$step.log" | condense)"
	fi
	# The views a kernel refused are warnings, not errors: keep their words;
	# and those of the views not expected on a node without a GPU (info),
	# whose refusal would otherwise show only as a missing finding.
	{ grep -E 'level=(WARN|ERROR)|autoglm_view_absent' "$out/$step.log" || true; } | sed -E 's/^time=[^ ]+ //' | while IFS= read -r l; do
		condense <<<"$l"
	done >"$out/$step.warnings"
	[ -s "$out/$step.json" ] || fail "no report"
}

# finding STEP KIND JQ-CONDITION WHAT: a finding of KIND for which the
# condition holds, else a reason naming WHAT.
finding() {
	local step=$1 kind=$2 cond=$3 what=$4
	[ -s "$out/$step.json" ] || return 0
	if ! jq -e --arg kind "$kind" "[.findings[] | select(.kind == \$kind) | select($cond)] | length > 0" "$out/$step.json" >/dev/null; then
		fail "no $kind $what (findings: $(jq -r '[.findings[].kind] | join(",")' "$out/$step.json"))"
	fi
}

# A stack frame names FUNC (native frames carry the function apart from
# the offset).
frame() { echo "any((.stack // [])[]; .function == \"$1\")"; }

step_check() {
	local rc=0
	timeout -k 10 "$limit" "$tool" check --programs >"$out/check.log" 2>&1 || rc=$?
	[ $rc -eq 0 ] || fail "check exit $rc: $(grep -E '^autoglm-ebpf:' "$out/check.log")"
	# What this kernel made of each program (instructions, verified, JIT
	# bytes): the figures that compare across kernels and architectures.
	sed -n '/^OBJECT /,$p' "$out/check.log" >"$out/programs"
	# What check says of each view and of anything not ok, a line each.
	awk '/^[^ ]/ { n++ } { print > (FILENAME ".row" n) }' "$out/check.log"
	for row in "$out"/check.log.row*; do
		if head -1 "$row" | grep -qE '^view |  (MISSING|no|absent)  |^verdict'; then
			condense <"$row"
		fi
	done >"$out/check.summary"
	rm -f "$out"/check.log.row*
}

# An fd leak named at its site: leak_tick opens /dev/null 20 times a second.
step_fd() {
	tool_run fd --duration 18s -- "$fix/fdwork" leak 20 60
	finding fd fd_leak "$(frame leak_tick) and (.summary | contains(\"leaking /dev/null (\"))" "at leak_tick leaking /dev/null"
}

# A child tracked from its fork (--children): after its exec it holds the
# 100 fds of its parent's 200 that are not close-on-exec, and what it has
# of stdin, stdout and stderr: its table must say so (the kernel's copy of
# its bitmap at exec), not the 200 it had before.
step_fork() {
	tool_run fork --children --duration 6s -- "$fix/fdwork" spawn 200 30
	[ -s "$out/fork.json" ] || return 0
	if ! jq -e '[.processes[] | select(.comm == "sleep" and .open_fds >= 100 and .open_fds <= 103)] | length > 0' "$out/fork.json" >/dev/null; then
		fail "the exec'd child's table: $(jq -c '[.processes[] | {comm, open_fds}]' "$out/fork.json")"
	fi
}

# Four NCCL ranks (forks of the fixture, tracked from their fork) in one
# communicator on the NCCL stand-in, each all-reducing 100 times a second:
# each rank's id, rank number and count (set-up and collective hooks). The
# ranks set up their communicator after 2 s, once the tool has them.
step_nccl() {
	tool_run nccl --children --duration 8s -- env NCCLRANK_START=2 "$fix/ncclrank" "$fix/nccl/libnccl.so.2" healthy 60
	[ -s "$out/nccl.json" ] || return 0
	if ! jq -e '[.processes[] | select(.nccl) | .nccl.communicators[]] | length == 4 and (map(.id) | unique | length == 1 and .[0] != "")
		and (map(.rank) | sort == [0,1,2,3]) and all(.nranks == 4 and .calls.allreduce > 0)' "$out/nccl.json" >/dev/null; then
		fail "the ranks' communicators: $(jq -c '[.processes[] | select(.nccl) | {pid, nccl: [.nccl.communicators[] | {id, rank, nranks, calls}]}]' "$out/nccl.json")"
	fi
}

# An NCCL straggler: rank 2 of four stalls in load_next_batch after 20
# steps while the others wait one collective ahead. Judged with a 10 s
# stall, it is named with that function where the kernel gives a
# switching thread's user registers (bpf_task_pt_regs, 5.15), and with the
# reason there are no stacks where it does not.
step_ncclstall() {
	tool_run ncclstall --children --nccl-stall 10s --duration 40s -- env NCCLRANK_START=2 "$fix/ncclrank" "$fix/nccl/libnccl.so.2" straggler 60 2 20
	finding ncclstall nccl_straggler '(.summary | contains("load_next_batch")) or (.evidence.stacks_unavailable | startswith("the kernel does not give"))' "naming load_next_batch, or why it cannot"
}

# make demo's worker on the CUDA stand-in: an fd leak, a 3 GiB burst at
# 12 s and a failed 2 GiB allocation at 15 s (1 GiB free per allocation).
step_cuda() {
	CUDA_STUB_LIMIT=1073741824 tool_run cuda --duration 30s -- "$fix/demo" 17 "$fix/cuda/libcudart.so.11.0"
	finding cuda fd_leak "$(frame cache_tokenizer)" "at cache_tokenizer"
	finding cuda gpu_alloc_burst "$(frame warmup_kv_cache)" "at warmup_kv_cache"
	finding cuda gpu_alloc_failure "$(frame load_adapter)" "at load_adapter"
}

# The memory snapshot at a failed allocation, pkg/cudatrack's own test
# (bin/cudatrack.test, built by make kernels; bin/arm64/ on arm64): what was live at the
# failure, a burst freed right after it included, whether the process is
# still there at the poll or not; and a loop of failures that makes one.
step_oomsnap() {
	local rc=0
	timeout -k 10 "$limit" "$tests/cudatrack.test" -test.run '^TestOOMSnapshot' -test.v -test.count=1 >"$out/oomsnap.log" 2>&1 || rc=$?
	[ $rc -eq 0 ] || fail "test exit $rc: $(test_failures "$out/oomsnap.log")"
}

# test_failures LOG: a go test's failures, on one line.
test_failures() {
	grep -E '^\s+[a-z_]+_test\.go:[0-9]+:|^--- FAIL|^panic:' "$1" | head -5 | tr -s ' \t\n' ' '
}

# Stacks of code built without frame pointers (C and C++, -O2, through the
# CUDA stand-in) held to eu-stack's frame for frame: pkg/fdtrack's own test
# (bin/fdtrack.test on x86, bin/arm64/ on arm64, where it is what shows the
# unwinder's AArch64 CFI and link register right on a kernel of that
# architecture); on arm64 also the chains built to sign their return
# addresses (PAC), whose stacks must name the functions of the unsigned
# builds' (elfutils 0.188 cannot unwind signed return addresses).
step_eustack() {
	local rc=0
	if [ ! -x "$tests/fdtrack.test" ]; then
		fail "$tests/fdtrack.test missing"
		return
	fi
	timeout -k 10 "$limit" "$tests/fdtrack.test" -test.run '^TestOpenStack(WithoutFramePointers|PAC)$' -test.v -test.count=1 >"$out/eustack.log" 2>&1 || rc=$?
	[ $rc -eq 0 ] || fail "test exit $rc: $(test_failures "$out/eustack.log")"
}

# A GPU memory leak: leak_weights takes 1 MiB every 50 ms and never frees.
step_gpuleak() {
	tool_run gpuleak --duration 24s -- "$fix/cudawork" "$fix/cuda/libcudart.so.11.0" leak 60
	finding gpuleak gpu_memory_leak "$(frame leak_weights) and (.summary | contains(\"made at leak_weights (cudawork.c:\"))" "made at leak_weights (cudawork.c:LINE)"
}

# A context-switch storm: pipe ping-pong between threads. It starts after
# the baseline is learnt (10 quiet intervals), so that a rate under the
# absolute ceiling (50 k/s: a slow emulated CPU may not reach it) is judged
# against the baseline and the floor. The floor is lowered: the guest's one
# emulated CPU switches 5-12 k/s under the storm, around the default floor
# (5 k/s, for real CPUs), and a dip under it ended the storm (CI, arm64 6.1).
# The storm lasts 10 s and the run ends with it, however long attaching
# took; the rate schedwork measured itself is in the reason if none is found.
step_sched() {
	tool_run sched --interval 500ms --ctx-switch-floor 1000 -- /bin/sh -c "sleep 7; exec $fix/schedwork storm 2 10"
	finding sched ctx_switch_storm "true" "for schedwork ($(grep -h '^switches_per_sec' "$out/sched.log" || echo 'switches_per_sec not printed'))"
}

# A CLOSE_WAIT leak on loopback TCP, named at the accept that opened it.
step_sock() {
	tool_run sock --duration 20s -- "$fix/sockwork" leaky-server 10 60
	finding sock socket_leak "$(frame accept_conn) and (.summary | contains(\"opened at accept_conn\"))" "opened at accept_conn"
}

# An fd leak in Python, named at the script's function and line.
step_python() {
	local script=$repo/testdata/python/leak.py line
	line=$(grep -n '# leak: open' "$script" | cut -d: -f1)
	if [ ! -x "$python" ]; then
		fail "$python missing"
		return
	fi
	tool_run python --duration 18s -- "$python" "$script" 20 60
	finding python fd_leak "any((.stack // [])[]; .kind == \"python\" and .function == \"cache_tokenizer\" and .file == \"$script\" and .line == $line) and (.summary | contains(\"at cache_tokenizer (leak.py:$line)\"))" "at cache_tokenizer ($script:$line)"
}

say "kernel $(uname -r)"
uname -a >"$out/uname"
for step in "${steps[@]}"; do
	why=()
	t0=$(date +%s)
	say "$step ..."
	"step_$step"
	if [ ${#why[@]} -eq 0 ]; then
		res=PASS
	else
		res=FAIL
	fi
	reasons=
	for w in "${why[@]}"; do
		reasons+="${reasons:+ ;; }$w"
	done
	printf '%s %s %s\n' "$step" "$res" "$reasons" >>"$out/results"
	say "$step $res ($(($(date +%s) - t0)) s)"
done
dmesg >"$out/dmesg" 2>&1 || true
say "done"
