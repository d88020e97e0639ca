package bpfobj

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachTraceUprobeSession is the attach type of session uprobes (Linux
// 6.13), BPF_TRACE_UPROBE_SESSION: cilium/ebpf loads programs of section
// uprobe.session with it but attaches uprobe_multi links only as
// BPF_TRACE_UPROBE_MULTI, and golang.org/x/sys does not name it yet.
const AttachTraceUprobeSession = ebpf.AttachType(57)

// uprobeMultiAttr is union bpf_attr's link_create with its uprobe_multi
// member (include/uapi/linux/bpf.h), which session links share.
type uprobeMultiAttr struct {
	progFD        uint32
	targetFD      uint32
	attachType    uint32
	flags         uint32
	path          unsafe.Pointer
	offsets       unsafe.Pointer
	refCtrOffsets unsafe.Pointer
	cookies       unsafe.Pointer
	cnt           uint32
	multiFlags    uint32
	pid           uint32
	_             uint32
}

// UprobeSession attaches prog, a uprobe.session program, to the functions
// at offsets in the file at path, for every process (pid 0) or one, each
// with its cookie (cookies: nil or one per offset). One program then runs
// at a function's entry and, unless the entry returned 1, at its return.
// The link is cilium/ebpf's own (a uprobe_multi link): closing it detaches
// every probe.
func UprobeSession(path string, prog *ebpf.Program, offsets, cookies []uint64, pid uint32) (link.Link, error) {
	if len(offsets) == 0 || (cookies != nil && len(cookies) != len(offsets)) {
		return nil, fmt.Errorf("uprobe session on %s: %d offsets, %d cookies", path, len(offsets), len(cookies))
	}
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	attr := uprobeMultiAttr{
		progFD:     uint32(prog.FD()),
		attachType: uint32(AttachTraceUprobeSession),
		path:       unsafe.Pointer(p),
		offsets:    unsafe.Pointer(&offsets[0]),
		cnt:        uint32(len(offsets)),
		pid:        pid,
	}
	if cookies != nil {
		attr.cookies = unsafe.Pointer(&cookies[0])
	}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_LINK_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(p)
	runtime.KeepAlive(offsets)
	runtime.KeepAlive(cookies)
	if errno != 0 {
		return nil, fmt.Errorf("uprobe session on %s: %w", path, errno)
	}
	l, err := link.NewFromFD(int(fd))
	if err != nil {
		return nil, fmt.Errorf("uprobe session on %s: %w", path, err)
	}
	return l, nil
}

// haveUprobeSession tells whether this kernel attaches session uprobes, as
// cilium/ebpf probes uprobe_multi links: a link on "/" fails with EBADF
// (not a regular file) once the kernel knows the attach type, and with
// EINVAL before (6.12 and older).
func haveUprobeSession() bool {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "probe_ups_link",
		Type:         ebpf.Kprobe,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		AttachType:   AttachTraceUprobeSession,
		License:      "GPL",
	})
	if err != nil {
		return false
	}
	defer prog.Close()
	l, err := UprobeSession("/", prog, []uint64{0}, nil, 0)
	if err == nil {
		_ = l.Close()
		return false // attached to a directory: not a kernel to trust with it
	}
	return errors.Is(err, unix.EBADF)
}
