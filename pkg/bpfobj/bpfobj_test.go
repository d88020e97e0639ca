package bpfobj

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

func tracepointSpec(tps ...string) *ebpf.CollectionSpec {
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{}}
	for _, tp := range tps {
		name := strings.ReplaceAll(tp, "/", "_")
		spec.Programs[name] = &ebpf.ProgramSpec{
			Name: name, Type: ebpf.TracePoint, SectionName: "tracepoint/" + tp, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		}
	}
	return spec
}

// fakeTracefs makes a tracefs root in which only the given events exist.
func fakeTracefs(t *testing.T, tps ...string) string {
	root := t.TempDir()
	for _, tp := range tps {
		dir := filepath.Join(root, "events", tp)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "id"), []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestTracepoint(t *testing.T) {
	for _, tc := range []struct{ section, group, event string }{
		{"tracepoint/syscalls/sys_enter_close", "syscalls", "sys_enter_close"},
		{"tracepoint/sock/inet_sock_set_state", "sock", "inet_sock_set_state"},
		{"sched/sched_switch", "sched", "sched_switch"},
		{"tracepoint/lonely", "lonely", ""},
	} {
		g, e := Tracepoint(&ebpf.ProgramSpec{SectionName: tc.section})
		if g != tc.group || e != tc.event {
			t.Errorf("Tracepoint(%q) = %q, %q; want %q, %q", tc.section, g, e, tc.group, tc.event)
		}
	}
}

func TestPruneTracepoints(t *testing.T) {
	root := fakeTracefs(t, "a/here", "b/here")
	none := func(string, string) bool { return false }
	for _, tc := range []struct {
		name      string
		tps       []string
		required  func(prog, tp string) bool
		wantSkip  []string
		wantProgs []string
		wantErr   string
	}{
		{"all present", []string{"a/here", "b/here"}, none, nil, []string{"a_here", "b_here"}, ""},
		{"optional missing", []string{"a/here", "a/gone", "c/gone"}, none, []string{"a/gone", "c/gone"}, []string{"a_here"}, ""},
		{"required by program", []string{"a/here", "a/gone"}, func(p, _ string) bool { return p == "a_gone" }, nil, nil,
			"tracepoint a/gone is missing: this kernel cannot trace things"},
		{"required by tracepoint", []string{"c/gone"}, func(_, tp string) bool { return tp == "c/gone" }, nil, nil,
			"tracepoint c/gone is missing: this kernel cannot trace things"},
		{"required but present", []string{"a/here"}, func(string, string) bool { return true }, nil, []string{"a_here"}, ""},
	} {
		spec := tracepointSpec(tc.tps...)
		skipped, err := PruneTracepoints(spec, root, tc.required, "trace things")
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		slices.Sort(skipped)
		if !slices.Equal(skipped, tc.wantSkip) {
			t.Errorf("%s: skipped %v, want %v", tc.name, skipped, tc.wantSkip)
		}
		var progs []string
		for name := range spec.Programs {
			progs = append(progs, name)
		}
		slices.Sort(progs)
		if !slices.Equal(progs, tc.wantProgs) {
			t.Errorf("%s: programs left %v, want %v", tc.name, progs, tc.wantProgs)
		}
	}
}

type closer struct {
	closed int
	err    error
}

func (c *closer) Close() error { c.closed++; return c.err }

func TestCloseNothingLoaded(t *testing.T) {
	if err := Close(nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	m := &closer{err: boom}
	if err := Close(nil, m, nil); !errors.Is(err, boom) || m.closed != 1 {
		t.Fatalf("Close = %v after %d map closes, want boom after 1", err, m.closed)
	}
}

func TestLoadAttachCounters(t *testing.T) {
	testutil.RequireRoot(t)

	// A program the verifier rejects (it reads R0 before setting it) names
	// the object and carries the verifier log.
	bad := tracepointSpec("syscalls/sys_enter_close")
	bad.Programs["syscalls_sys_enter_close"].Instructions = asm.Instructions{asm.Return()}
	if _, err := LoadCollection(bad, "test BPF programs", nil); err == nil ||
		!strings.HasPrefix(err.Error(), "loading test BPF programs: ") || !strings.Contains(err.Error(), "R0") {
		t.Fatalf("loading a bad program: %v", err)
	}

	var maps testMaps
	load := func() (*ebpf.CollectionSpec, error) {
		spec := tracepointSpec("syscalls/sys_enter_close")
		spec.Programs["enter_btf"] = &ebpf.ProgramSpec{
			Name: "enter_btf", Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp, AttachTo: "sys_enter",
			SectionName: "tp_btf/sys_enter", License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		}
		spec.Maps = map[string]*ebpf.MapSpec{
			"errors": {Name: "errors", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 4},
		}
		return spec, nil
	}
	// Each mode loads only its own programs; a tp_btf object the kernel
	// refuses falls back to the classic tracepoints and says why.
	for _, tc := range []struct {
		name       string
		opts       Options
		load       func() (*ebpf.CollectionSpec, error)
		mode, prog string
		btfErr     bool
	}{
		{"btf", Options{What: "test", Maps: &maps}, load, ModeBTF, "enter_btf", false},
		{"forced tracepoint", Options{What: "test", Maps: &maps, Tracepoint: true}, load, ModeTracepoint, "syscalls_sys_enter_close", false},
		{"btf refused", Options{What: "test", Maps: &maps}, func() (*ebpf.CollectionSpec, error) {
			spec, _ := load()
			spec.Programs["enter_btf"].AttachTo = "no_such_tracepoint"
			return spec, nil
		}, ModeTracepoint, "syscalls_sys_enter_close", true},
	} {
		obj, err := Open(tc.load, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		progs := obj.Programs()
		if obj.Mode != tc.mode || len(progs) != 1 || progs[tc.prog] == nil || len(obj.links) != 1 || (obj.BTFError != nil) != tc.btfErr {
			t.Errorf("%s: mode %s, programs %v, %d links, BTF error %v", tc.name, obj.Mode, progs, len(obj.links), obj.BTFError)
		}
		if err := obj.Close(); err != nil {
			t.Fatal(err)
		}
		if obj.Programs() != nil {
			t.Errorf("%s: programs still there after Close", tc.name)
		}
	}

	obj, err := Open(load, Options{What: "test", Maps: &maps})
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	m := maps.Errors
	per := make([]uint64, ebpf.MustPossibleCPU())
	for i := range per {
		per[i] = uint64(i + 1)
	}
	if err := m.Put(uint32(2), per); err != nil {
		t.Fatal(err)
	}
	type kind uint32
	got, err := Counters(m, map[kind]string{0: "zero", 2: "two"})
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(len(per))
	if got["zero"] != 0 || got["two"] != n*(n+1)/2 || len(got) != 2 {
		t.Errorf("Counters = %v, want zero:0 two:%d", got, n*(n+1)/2)
	}
	if _, err := Counters(m, map[kind]string{9: "out of range"}); err == nil {
		t.Error("Counters past the map's end: no error")
	}
}

type testMaps struct {
	Errors *ebpf.Map `ebpf:"errors"`
}

func (m *testMaps) Close() error { return m.Errors.Close() }

// Loads in flight together share one decoding of the kernel's types; the
// last one done lets it go.
func TestSharedKernelTypes(t *testing.T) {
	var s sharedBTF
	a, b := s.acquire(), s.acquire()
	if a == nil || a != b {
		t.Fatal("two loads in flight decode the kernel's types twice")
	}
	s.release()
	if s.cache != a {
		t.Fatal("let go while a load is in flight")
	}
	s.release()
	if s.cache != nil {
		t.Fatal("kept after the last load")
	}
	if c := s.acquire(); c == nil || c == a {
		t.Fatal("a later load reuses what was let go")
	}
}

// A load refused with EPERM names the capabilities, and the seccomp filter
// where the process has one (mode 2).
func TestEPERMCause(t *testing.T) {
	const caps = "needs root or CAP_BPF+CAP_PERFMON"
	for _, c := range []struct {
		status string
		filter bool
	}{
		{"Name:\tautoglm-ebpf\nSeccomp:\t0\nSeccomp_filters:\t0\n", false},
		{"Name:\tautoglm-ebpf\nSeccomp:\t2\nSeccomp_filters:\t1\n", true},
		{"", false},
	} {
		got := epermCause(c.status)
		if !strings.HasPrefix(got, caps) || strings.Contains(got, "seccomp filter") != c.filter {
			t.Errorf("status %q: %q, want the capabilities, the filter named: %v", c.status, got, c.filter)
		}
	}
}

// The costs check --programs lists are the kernel's own for each program
// loaded while recording, and recording stops when asked for them.
func TestRecordCosts(t *testing.T) {
	testutil.RequireRoot(t)
	load := func() {
		t.Helper()
		coll, err := LoadCollection(tracepointSpec("syscalls/sys_enter_close"), "test BPF programs (tracepoint)", nil)
		if err != nil {
			t.Fatal(err)
		}
		coll.Close()
	}
	done := RecordCosts()
	load()
	costs := done()
	if len(costs) != 1 {
		t.Fatalf("recorded %+v, want the one program", costs)
	}
	c := costs[0]
	if c.Object != "test (tracepoint)" || c.Program != "syscalls_sys_enter_close" || c.Translated != 2 || c.JITed == 0 {
		t.Errorf("recorded %+v, want test (tracepoint)'s syscalls_sys_enter_close: 2 instructions, some machine code", c)
	}
	// Two instructions on one path; the kernel says so from 5.16.
	if modern := testutil.KernelAtLeast(t, 5, 16); (c.Verified == 2) != modern {
		t.Errorf("kernel 5.16 or later: %v; %d instructions verified, want 2 from 5.16 and none reported before", modern, c.Verified)
	}
	load()
	if again := done(); len(again) != 0 {
		t.Errorf("recorded %+v after recording stopped", again)
	}
}
