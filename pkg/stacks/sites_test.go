package stacks

import (
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"
)

func TestSiteID(t *testing.T) {
	for _, s := range []Site{{0, 1}, {8191, 0xffffffff}, {1<<31 - 1, 0x80000000}, {5, 0}} {
		id := s.ID()
		if id < 0 {
			t.Errorf("%+v.ID() = %d < 0", s, id)
		}
		if got := SiteOf(id); got != s {
			t.Errorf("SiteOf(%+v.ID()) = %+v", s, got)
		}
	}
	if (Site{-1, 7}).ID() != -1 || SiteOf(-1) != (Site{Stack: -1}) {
		t.Error("a site without a native stack is not -1")
	}
}

// The Python maps the service creates hold what pkg/pyframes writes and reads.
func TestPythonLayout(t *testing.T) {
	if err := pyframes.SameLayout(stacksPyProc{}, pyframes.Proc{}); err != nil {
		t.Error(err)
	}
	if err := pyframes.SameLayout(stacksPyStack{}, pyframes.Stack{}); err != nil {
		t.Error(err)
	}
}
