package symbolize

import (
	"testing"
)

// A panic while reading one file (its headers, or its symbols later) costs
// that file's frames only: the caller gets the module-level frame, the
// panic is counted, and the file is not read again.
func TestContainPanics(t *testing.T) {
	bin := buildTarget(t, "target", "-fPIE", "-pie", "-Wl,--build-id=sha1")
	pid, addr := startTarget(t, bin)

	for _, tc := range []struct {
		name  string
		panic int // the read of bin that panics: 1 the headers, 2 the symbols
	}{{"headers", 1}, {"symbols", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			reads := 0
			panicHook = func(path string) {
				if path != bin {
					return
				}
				if reads++; reads == tc.panic {
					panic("crafted file")
				}
			}
			t.Cleanup(func() { panicHook = nil })
			s := New("/proc")

			for i := range 2 {
				f := s.Frames(pid, []uint64{addr + 4, 0x10})
				if f[0].Path != bin || f[0].Module != "target" || f[0].Function != "" || f[0].BuildID != "" || f[1].Address != 0x10 {
					t.Fatalf("call %d: frames %+v, want bin's module without symbols, then the bare address", i, f)
				}
				if got := s.Panics(); got != 1 {
					t.Fatalf("call %d: Panics() = %d, want 1", i, got)
				}
			}
			if reads != tc.panic {
				t.Errorf("bin read %d times, want %d: a file that panicked is read again", reads, tc.panic)
			}
			// Its unwind rules are gone with it: the stack ends there.
			if _, rules := s.UnwindCopy(pid, StackCopy{PC: addr + 5}, 4); rules[addr+4].Rule != fpRule || rules[addr+4].File != 0 {
				t.Errorf("rule at a panicked file = %+v, want the frame-pointer rule of no file", rules[addr+4])
			}
		})
	}
}

// A panic while finding an unwind rule ends that stack, and the agent
// goes on.
func TestContainRulePanic(t *testing.T) {
	bin := buildTarget(t, "target", "-fPIE", "-pie", "-Wl,--build-id=sha1")
	pid, addr := startTarget(t, bin)
	s := New("/proc")
	if _, rules := s.UnwindCopy(pid, StackCopy{PC: addr + 5}, 4); rules[addr+4].File == 0 {
		t.Fatalf("rule at leakyfn = %+v, want one of bin", rules[addr+4])
	}
	panicHook = func(path string) {
		if path == bin {
			panic("crafted CFI")
		}
	}
	t.Cleanup(func() { panicHook = nil })
	pcs, rules := s.UnwindCopy(pid, StackCopy{PC: addr + 9}, 4)
	if len(pcs) != 0 || rules[addr+8].Rule != endRule || s.Panics() != 1 {
		t.Errorf("after a panic: pcs %x, rule %+v, Panics() %d; want none, the end rule, 1", pcs, rules[addr+8], s.Panics())
	}
}
