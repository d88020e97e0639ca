package discover

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A process that dlopens the CUDA runtime late (as PyTorch does) is
// reported when the library is mapped, and every exec is reported; a
// program that maps other libraries is not reported as a CUDA user. Both
// ways of attaching.
func TestEvents(t *testing.T) {
	testutil.RequireRoot(t)
	rt := testutil.CUDAStubs(t)
	bin := testutil.Fixture(t, "cudawork")
	for _, mode := range []string{bpfobj.ModeBTF, bpfobj.ModeTracepoint} {
		t.Run(mode, func(t *testing.T) {
			w, err := New(mode == bpfobj.ModeTracepoint)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if w.Mode() != mode {
				t.Fatalf("attached as %s, want %s", w.Mode(), mode)
			}
			plain := exec.Command("/bin/true")
			if err := plain.Run(); err != nil {
				t.Fatal(err)
			}
			cuda := exec.Command(bin, rt, "steady", "2")
			cuda.Stderr = os.Stderr
			if err := cuda.Start(); err != nil {
				t.Fatal(err)
			}
			defer cuda.Wait()
			got := map[Event]bool{}
			want := []Event{{plain.Process.Pid, Exec}, {cuda.Process.Pid, Exec}, {cuda.Process.Pid, CUDAMapped}}
			testutil.Eventually(t, 20*time.Second, fmt.Sprintf("events %v", want), func() bool {
				events, err := w.Drain()
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range events {
					got[e] = true
				}
				return all(got, want)
			})
			if got[Event{plain.Process.Pid, CUDAMapped}] {
				t.Error("/bin/true reported as mapping CUDA")
			}
			lost, err := w.Lost()
			if err != nil || lost["discover_ringbuf"] != 0 {
				t.Errorf("lost %v, %v", lost, err)
			}
		})
	}
}

func all(got map[Event]bool, want []Event) bool {
	for _, e := range want {
		if !got[e] {
			return false
		}
	}
	return true
}
