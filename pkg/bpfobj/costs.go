package bpfobj

import (
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
)

// ProgramCost is what the kernel says one loaded program costs. Unlike an
// object's ELF instruction count it is what this kernel and architecture
// made of the program: the figures to compare across kernels and
// architectures (issue 34: on an emulated arm64 machine, timings are not).
type ProgramCost struct {
	Object, Program string
	// Translated counts the instructions after the kernel's rewrites
	// (subprograms linked, helpers inlined, CO-RE relocated).
	Translated int
	// Verified counts the instructions the verifier processed: every path
	// it walked, the figure its one-million limit applies to. Zero where
	// the kernel does not report it (before 5.16).
	Verified uint32
	// JITed is the machine code's size in bytes.
	JITed uint32
}

// costLog is off but while `check --programs` runs: a run loads each
// object once and keeps no list of what it loaded.
var costLog struct {
	mu   sync.Mutex
	on   bool
	list []ProgramCost
}

// RecordCosts makes the loads that follow note their programs' costs until
// the returned function is called, which returns them sorted by object and
// program.
func RecordCosts() (done func() []ProgramCost) {
	costLog.mu.Lock()
	costLog.on, costLog.list = true, nil
	costLog.mu.Unlock()
	return func() []ProgramCost {
		costLog.mu.Lock()
		defer costLog.mu.Unlock()
		list := costLog.list
		costLog.on, costLog.list = false, nil
		slices.SortFunc(list, func(a, b ProgramCost) int {
			if c := strings.Compare(a.Object, b.Object); c != 0 {
				return c
			}
			return strings.Compare(a.Program, b.Program)
		})
		return list
	}
}

// noteCosts reads coll's programs' costs from the kernel when recording.
// A figure the kernel does not give stays zero: this is a report, not a
// reason to fail a load.
func noteCosts(what string, coll *ebpf.Collection) {
	costLog.mu.Lock()
	defer costLog.mu.Unlock()
	if !costLog.on {
		return
	}
	for name, p := range coll.Programs {
		// "fd BPF programs (tp_btf)": "fd (tp_btf)"
		c := ProgramCost{Object: strings.Replace(what, " BPF programs", "", 1), Program: name}
		if info, err := p.Info(); err == nil {
			if n, err := info.TranslatedSize(); err == nil {
				c.Translated = n / 8 // asm.InstructionSize: a wide load counts twice, as bpftool's xlated does
			}
			c.Verified, _ = info.VerifiedInstructions()
			c.JITed, _ = info.JitedSize()
		}
		costLog.list = append(costLog.list, c)
	}
}
