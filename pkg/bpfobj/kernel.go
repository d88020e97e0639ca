package bpfobj

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Kernel is what the running kernel offers the BPF objects. Each field is
// found by a real load (cilium/ebpf's feature probes) or in the kernel's own
// BTF, never from its version number: distributions backport features, and
// the version says nothing about RT or a vendor's configuration.
type Kernel struct {
	// TaskStorage: task storage maps and bpf_get_current_task_btf (5.11).
	// Without them per-thread state lives in LRU hashes by thread id.
	TaskStorage bool
	// TaskPtRegs: bpf_task_pt_regs (5.15), which gives a classic syscall
	// tracepoint the user registers an opening stack starts from.
	TaskPtRegs bool
	// Cookies: bpf_get_attach_cookie in uprobes (5.15). Without them each
	// hooked CUDA function gets an entry program of its own.
	Cookies bool
	// RuntimeAlloc: hash maps allocated at run time are safe in tracing
	// programs, which needs the BPF memory allocator (6.1). Before it the
	// verifier warns (a kernel WARN with a stack trace: a panic under
	// panic_on_warn) or, on PREEMPT_RT, refuses; hash maps are then
	// preallocated.
	RuntimeAlloc bool
	// UprobeSession: session uprobes (6.13), one program for a function's
	// entry and return whose entry can decline the return. Without them
	// the CUDA hooks are uprobe and uretprobe pairs.
	UprobeSession bool
	// Memlock says how map memory is charged: "memcg" (5.11+, or the
	// limit was unlimited already), RLIMIT_MEMLOCK raised for this process,
	// or why it could not be.
	Memlock string
}

// PreallocPerCPU caps the entries of a per-CPU hash map that must be
// preallocated (kernels before 6.1): every entry costs its value size on
// every possible CPU, taken at load. It bounds the processes watched at
// once there.
const PreallocPerCPU = 1024

// Probe finds out, once per process, what the kernel offers, and raises the
// memlock limit where the kernel still charges maps to it (before 5.11):
// without that every map create fails there.
var Probe = sync.OnceValue(func() Kernel {
	k := Kernel{
		TaskStorage: features.HaveMapType(ebpf.TaskStorage) == nil &&
			features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetCurrentTaskBtf) == nil,
		Cookies:       features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie) == nil,
		RuntimeAlloc:  haveMemAlloc(),
		UprobeSession: haveUprobeSession(),
	}
	k.TaskPtRegs = k.TaskStorage && features.HaveProgramHelper(ebpf.TracePoint, asm.FnTaskPtRegs) == nil
	var before, after unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &before)
	switch err := rlimit.RemoveMemlock(); {
	case err != nil:
		k.Memlock = "RLIMIT_MEMLOCK could not be raised: " + err.Error()
		// Said before the loads fail there: their EPERM names no limit.
		slog.Warn("RLIMIT_MEMLOCK could not be raised: kernels before 5.11 charge BPF maps to it and refuse maps over it; give the process CAP_SYS_RESOURCE or an unlimited memlock limit",
			"limit_bytes", before.Cur, "err", err)
	case unix.Getrlimit(unix.RLIMIT_MEMLOCK, &after) == nil && after.Cur != before.Cur:
		k.Memlock = "RLIMIT_MEMLOCK (raised to unlimited)"
	default:
		k.Memlock = "memcg"
	}
	slog.Debug("kernel BPF features", "features", fmt.Sprintf("%+v", k))
	return k
})

// haveMemAlloc looks for the BPF memory allocator's type in the kernel's
// BTF: probing the verifier itself would trigger the very WARN it avoids.
func haveMemAlloc() bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var s *btf.Struct
	return spec.TypeByName("bpf_mem_alloc", &s) == nil
}

// Adapt fits spec to the kernel before it is loaded: it sets the have_*
// constants the programs branch on (bpf/common.h), gives each task storage
// map's fallback (the map of the same name with "_tid") its room or takes
// it away, and preallocates hash maps where run-time allocation is unsafe.
func (k Kernel) Adapt(spec *ebpf.CollectionSpec) error {
	for name, val := range map[string]bool{"have_task_storage": k.TaskStorage, "have_task_pt_regs": k.TaskPtRegs} {
		if v := spec.Variables[name]; v != nil {
			if err := v.Set(val); err != nil {
				return fmt.Errorf("setting %s: %w", name, err)
			}
		}
	}
	for name, m := range spec.Maps {
		if m.Type != ebpf.TaskStorage {
			continue
		}
		fallback := spec.Maps[name+"_tid"]
		if k.TaskStorage {
			// Referenced by the programs' other branch: it must exist, but
			// nothing is ever stored in it.
			if fallback != nil {
				fallback.MaxEntries = 1
			}
			continue
		}
		// Likewise the task storage map on a kernel without: a one-entry
		// array stands in for it.
		m.Type, m.Flags, m.MaxEntries = ebpf.Array, 0, 1
	}
	if !k.RuntimeAlloc {
		for _, m := range spec.Maps {
			if (m.Type != ebpf.Hash && m.Type != ebpf.PerCPUHash) || m.Flags&unix.BPF_F_NO_PREALLOC == 0 {
				continue
			}
			m.Flags &^= unix.BPF_F_NO_PREALLOC
			if m.Type == ebpf.PerCPUHash {
				m.MaxEntries = min(m.MaxEntries, PreallocPerCPU)
			}
		}
	}
	return nil
}
