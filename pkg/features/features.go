// Package features finds out what this kernel and machine offer the tool, for
// `autoglm-ebpf check`: each probe is a real load or attach where that is the
// only reliable answer (kprobes load but cannot attach without CONFIG_KPROBES).
package features

import (
	"fmt"
	"os"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	gpusample "github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
)

// NVML is the name of NVML's line: not a view, but what GPU metrics need.
const NVML = "NVML (GPU metrics)"

// Result is one line of the check.
type Result struct {
	Name     string
	OK       bool
	Detail   string
	Required bool // the tool cannot work without it
	// Absent, on a line not OK, says why what it serves is not expected on
	// this node (gpunode): its view is absent, not down.
	Absent model.Absence
}

// Check runs the probes of the kernel and machine, NVML's included; each
// view's are its own (pipeline.Checks). devs are the node's GPUs, which say
// whether NVML is expected. It mounts tracefs when it is missing, as
// attaching does.
func Check(devs gpunode.Devices) []Result {
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

	rs = append(rs, capsResult())

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
	add("uprobe attach (CUDA hooks)", false, AttachUprobe(), "attaches")
	return append(rs, gpus(devs), nvml(gonvml.New(), devs))
}

// gpus says which GPUs the node has and which the agent was given: without
// any, the GPU views are not expected here.
func gpus(devs gpunode.Devices) Result {
	r := Result{Name: "NVIDIA GPUs (/dev/nvidia[0-9]*)", OK: len(devs.Node) > 0}
	if !r.OK {
		r.Detail = "none on this node (its /dev and the host's): the cuda, nccl and nvml views are not expected here"
		return r
	}
	given := strings.Join(devs.Agent, " ")
	if given == "" {
		given = "none (NVML cannot read them)"
	}
	r.Detail = "on the node: " + strings.Join(devs.Node, " ") + "; given to this process: " + given
	return r
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
		{"session uprobes (6.13)", "CUDA hooks as uprobe and uretprobe pairs: every hooked call runs its return probe", k.UprobeSession},
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

// AttachUprobe attaches a uprobe to this program, as the CUDA view does to
// each process.
func AttachUprobe() error {
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
func nvml(lib gonvml.Interface, devs gpunode.Devices) Result {
	r := Result{Name: NVML}
	detail, err := gpusample.Probe(lib)
	if err != nil {
		r.Detail = err.Error() + " (everything else works)"
		r.Absent = devs.Absence("nvml", err)
		return r
	}
	r.OK, r.Detail = true, detail
	return r
}
