// Package features finds out what this kernel and machine offer the tool, for
// `autoglm-ebpf check`: each probe is a real load or attach where that is the
// only reliable answer (kprobes load but cannot attach without CONFIG_KPROBES).
package features

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/cudatrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/fdtrack"
	gpusample "github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/socktrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
)

// Result is one line of the check.
type Result struct {
	Name     string
	OK       bool
	Detail   string
	Required bool // the tool cannot work without it
}

// Check runs every probe. It mounts tracefs when it is missing, as attaching
// does.
func Check() []Result {
	var rs []Result
	add := func(name string, required bool, err error, okDetail string) {
		r := Result{Name: name, OK: err == nil, Required: required, Detail: okDetail}
		if err != nil {
			r.Detail = err.Error()
		}
		rs = append(rs, r)
	}

	var uts unix.Utsname
	_ = unix.Uname(&uts)
	rs = append(rs, Result{Name: "kernel", OK: true, Detail: unix.ByteSliceToString(uts.Release[:])})
	rs = append(rs, kernel(bpfobj.Probe())...)

	var privErr error
	if os.Geteuid() != 0 {
		privErr = errors.New("not root: loading BPF needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for tracefs)")
	}
	add("privileges", true, privErr, "root")

	_, btfErr := os.Stat("/sys/kernel/btf/vmlinux")
	add("BTF (/sys/kernel/btf/vmlinux)", true, btfErr, "present")

	root, mounted, tfErr := tracefs.Ensure()
	detail := "mounted at " + root
	if mounted {
		detail = "was not mounted; mounted it at " + root
	}
	add("tracefs", true, tfErr, detail)

	for _, pt := range []struct {
		t        ebpf.ProgramType
		required bool
	}{{ebpf.TracePoint, true}, {ebpf.RawTracepoint, false}, {ebpf.Tracing, false}, {ebpf.Kprobe, false}} {
		add("program type "+pt.t.String(), pt.required, features.HaveProgramType(pt.t), "loads")
	}
	for _, mt := range []struct {
		t        ebpf.MapType
		required bool
	}{{ebpf.Hash, true}, {ebpf.PerCPUHash, true}, {ebpf.PerCPUArray, true}, {ebpf.StackTrace, true}, {ebpf.RingBuf, false}} {
		add("map type "+mt.t.String(), mt.required, features.HaveMapType(mt.t), "creates")
	}

	add("kprobe attach (optional fallback)", false, attachKprobe(), "attaches")
	add("uprobe attach (CUDA hooks)", false, attachUprobe(), "attaches")

	rs = append(rs, fd())
	if tfErr == nil {
		rs = append(rs, sockTracepoint(root))
	}
	rs = append(rs, sock())
	rs = append(rs, sched()...)
	rs = append(rs, cuda())
	rs = append(rs, python())
	rs = append(rs, nvml())
	rs = append(rs, cudaHooks()...)
	return rs
}

// kernel lists the BPF features the objects adapt to, each with what its
// absence costs (bpfobj.Kernel).
func kernel(k bpfobj.Kernel) []Result {
	lines := []struct {
		name, absent string
		ok           bool
	}{
		{"task storage (5.11)", "per-thread state in LRU hashes by thread id", k.TaskStorage},
		{"bpf_task_pt_regs (5.15)", "no fd opening stacks where classic tracepoints are used", k.TaskPtRegs},
		{"uprobe cookies (5.15)", "one CUDA entry program per hooked function", k.Cookies},
		{"BPF memory allocator (6.1)", fmt.Sprintf("hash maps preallocated; per-CPU ones hold %d processes", bpfobj.PreallocPerCPU), k.RuntimeAlloc},
	}
	var rs []Result
	for _, l := range lines {
		r := Result{Name: "kernel feature " + l.name, OK: l.ok, Detail: "present"}
		if !l.ok {
			r.Detail = "missing: " + l.absent
		}
		rs = append(rs, r)
	}
	return append(rs, Result{Name: "BPF map memory charged to", OK: !strings.HasPrefix(k.Memlock, "RLIMIT_MEMLOCK could not"), Required: true, Detail: k.Memlock})
}

// Ready reports whether every required probe passed.
func Ready(rs []Result) bool {
	for _, r := range rs {
		if r.Required && !r.OK {
			return false
		}
	}
	return true
}

// fd loads and attaches the fd object as a run would, and reports how the
// fd-creating syscalls are traced.
func fd() Result {
	r := Result{Name: "view fd (raw_syscalls sys_enter/sys_exit)", Required: true}
	t, err := fdtrack.New(fdtrack.Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return r
	}
	defer t.Close()
	r.OK, r.Detail = true, t.Mode()
	if t.Mode() == bpfobj.ModeTracepoint {
		r.Detail = "tracepoint (tp_btf unavailable: " + bpfobj.Summary(t.BTFError()) + ")"
		if !bpfobj.Probe().TaskPtRegs {
			r.Detail += "; no opening stacks without bpf_task_pt_regs"
		}
	}
	// What bounds the /proc reads of fd tables (autoglm_fd_descriptions_*).
	r.Detail += fmt.Sprintf("; children of watched processes tracked from fork (task_newtask), their inherited fds from the parent's table; at most %d fds described from /proc a poll (daemon --fd-reads-per-poll), larger tables filled over several", fdtrack.DefaultReadsPerPoll)
	return r
}

// sock loads and attaches the socket object as a run would.
func sock() Result {
	r := Result{Name: "view sock (TCP socket states)"}
	t, err := socktrack.New(socktrack.Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return r
	}
	defer t.Close()
	r.OK, r.Detail = true, "loads and attaches"
	return r
}

// cuda loads the CUDA object as a run would, and attaches a uprobe as it
// does to each process.
func cuda() Result {
	r := Result{Name: "view cuda (allocation hooks)"}
	t, err := cudatrack.NewTracker(cudatrack.Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return r
	}
	defer t.Close()
	if err := attachUprobe(); err != nil {
		r.Detail = "loads, but uprobes do not attach: " + err.Error()
		return r
	}
	r.OK, r.Detail = true, "loads; uprobes attach"
	if !bpfobj.Probe().Cookies {
		r.Detail += ", one entry program per function (no uprobe cookies)"
	}
	return r
}

// python says how Python frames are captured: inside the fd and cuda
// objects, so they load with those; only the per-thread state differs.
func python() Result {
	r := Result{Name: "view python (frames in fd and CUDA stacks)", OK: true, Detail: "per-thread state in task storage"}
	if !bpfobj.Probe().TaskStorage {
		r.Detail = "per-thread state in an LRU hash by thread id (no task storage)"
	}
	return r
}

// sockTracepoint reports the tracepoint socket tracking cannot do without.
func sockTracepoint(root string) Result {
	group, event := filepath.Split(socktrack.Tracepoint)
	r := Result{Name: "tracepoint " + socktrack.Tracepoint, OK: tracefs.EventExists(root, filepath.Clean(group), event), Detail: "present"}
	if !r.OK {
		r.Detail = "missing: TCP sockets (CLOSE_WAIT leaks) are not tracked"
	}
	return r
}

func trivial(pt ebpf.ProgramType) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         pt,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
}

func attachKprobe() error {
	prog, err := trivial(ebpf.Kprobe)
	if err != nil {
		return err
	}
	defer prog.Close()
	l, err := link.Kprobe("do_sys_openat2", prog, nil)
	if err != nil {
		return fmt.Errorf("unavailable: %w", err)
	}
	return l.Close()
}

func attachUprobe() error {
	prog, err := trivial(ebpf.Kprobe)
	if err != nil {
		return err
	}
	defer prog.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ex, err := link.OpenExecutable(self)
	if err != nil {
		return err
	}
	l, err := ex.Uprobe("main.main", prog, &link.UprobeOptions{PID: os.Getpid()})
	if err != nil {
		return fmt.Errorf("unavailable: %w", err)
	}
	return l.Close()
}

// nvml initializes the NVIDIA management library once: GPU sampling needs
// the library and a loaded driver.
func nvml() Result {
	r := Result{Name: "NVML (GPU metrics)"}
	detail, err := gpusample.Probe(gonvml.New())
	if err != nil {
		r.Detail = err.Error() + " (everything else works)"
		return r
	}
	r.OK, r.Detail = true, detail
	return r
}

// cudaHooks lists, for the CUDA runtime and driver libraries installed here,
// which hooked functions each defines. A missing function (older library) or
// library is reported, never fatal: hooks attach to whatever a process maps.
func cudaHooks() []Result {
	libs, err := cudatrack.SystemLibraries()
	multi := Result{Name: "uprobe_multi links (CUDA hooks)", Detail: "present"}
	if merr := features.HaveBPFLinkUprobeMulti(); merr != nil {
		multi.Detail = "unavailable (" + merr.Error() + "): one uprobe per function, slow to detach"
	} else {
		multi.OK = true
	}
	rs := []Result{multi}
	if err != nil {
		rs = append(rs, Result{Name: "CUDA libraries", Detail: err.Error()})
	}
	for _, layer := range []struct{ layer, kind, name string }{
		{cudatrack.LayerRuntime, "runtime", "libcudart.so"},
		{cudatrack.LayerDriver, "driver", "libcuda.so.1"},
	} {
		found := false
		for _, lib := range libs {
			if lib.Kind != layer.kind {
				continue
			}
			found = true
			missing := map[string]bool{}
			for _, m := range lib.Missing {
				missing[m] = true
			}
			for _, fn := range cudatrack.LayerSymbols(layer.layer) {
				r := Result{Name: "CUDA hook " + fn, OK: !missing[fn], Detail: lib.Path}
				if missing[fn] {
					r.Detail = "not in " + lib.Path + " (older version): not hooked"
				}
				rs = append(rs, r)
			}
		}
		if !found {
			rs = append(rs, Result{Name: "CUDA " + layer.kind + " (" + layer.name + ")", Detail: "not installed in the standard places; hooks attach to the copy a process maps"})
		}
	}
	return rs
}
