package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// check names a view absent where it is not expected, on its lines and in
// the verdict with why, apart from a probe that merely failed.
func TestCheckOutputAbsent(t *testing.T) {
	rs := []features.Result{
		{Name: "capabilities", OK: true, Required: true, Detail: "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH effective"},
		{Name: "kprobe attach (optional fallback)", Detail: "unavailable"},
		{Name: "NVIDIA GPUs (/dev/nvidia[0-9]*)", Detail: "none on this node"},
		{Name: features.NVML, Detail: "NVML unavailable: libnvidia-ml.so.1 not found", Absent: model.AbsentNoGPU},
		{Name: "view fd (raw_syscalls sys_enter/sys_exit)", OK: true, Required: true, Detail: "tp_btf"},
		{Name: "view cuda (allocation hooks)", Detail: "loads, but uprobes do not attach", Absent: model.AbsentNoGPU},
	}
	var out bytes.Buffer
	if err := printCheck(&out, rs, []string{"fd leaks"}, map[string]model.Absence{"cuda": model.AbsentNoGPU}); err != nil {
		t.Fatalf("printCheck: %v\n%s", err, &out)
	}
	for _, line := range []string{
		`kprobe attach \(optional fallback\)\s+no\s+unavailable`,
		`NVML \(GPU metrics\)\s+absent\s+NVML unavailable: libnvidia-ml.so.1 not found`,
		`view cuda \(allocation hooks\)\s+absent\s+loads, but uprobes do not attach`,
		`view fd \S+ \S+\s+ok\s+tp_btf`,
	} {
		if !regexp.MustCompile(`(?m)^` + line + `$`).Match(out.Bytes()) {
			t.Errorf("no line %q in\n%s", line, &out)
		}
	}
	const verdict = "verdict: ready: fd leaks; absent, not expected on this node: cuda (no NVIDIA GPU on this node), nvml (no NVIDIA GPU on this node)\n"
	if !strings.HasSuffix(out.String(), verdict) {
		t.Errorf("verdict:\n%s\nwant it to end %q", &out, verdict)
	}

	// Where everything runs, the verdict lists no absence.
	rs[3] = features.Result{Name: features.NVML, OK: true, Detail: "driver 550.54.15, 1 devices"}
	out.Reset()
	if err := printCheck(&out, rs, []string{"fd leaks"}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "verdict: ready: fd leaks, GPU metrics (NVML)\n") {
		t.Errorf("verdict with NVML up:\n%s", &out)
	}
}

// --programs lists each program's figures, with "-" where the kernel does
// not count the verifier's instructions.
func TestCheckProgramCosts(t *testing.T) {
	var out bytes.Buffer
	printCosts(&out, []bpfobj.ProgramCost{
		{Object: "fd (tp_btf)", Program: "sys_exit_btf", Translated: 2087, Verified: 28185, JITed: 9927},
		{Object: "sched (tracepoint)", Program: "switch_tp", Translated: 329, JITed: 1520},
	})
	for _, line := range []string{
		`OBJECT\s+PROGRAM\s+INSNS\s+VERIFIED\s+JIT BYTES`,
		`fd \(tp_btf\)\s+sys_exit_btf\s+2087\s+28185\s+9927`,
		`sched \(tracepoint\)\s+switch_tp\s+329\s+-\s+1520`,
	} {
		if !regexp.MustCompile(`(?m)^` + line + `$`).Match(out.Bytes()) {
			t.Errorf("no line %q in\n%s", line, &out)
		}
	}
}
