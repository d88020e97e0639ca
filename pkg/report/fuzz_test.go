package report

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A report file is outside input (`autoglm-ebpf report FILE` renders one
// from another machine, or CI): whatever it holds, Decode either refuses
// it or gives a report that renders as HTML without error or panic, and
// whose call sites make profiles.
//
//	go test -run '^$' -fuzz FuzzReport ./pkg/report
func FuzzReport(f *testing.F) {
	// A run of every view and finding kind, 8 intervals of history.
	js := filepath.Join(f.TempDir(), "r.json")
	run(f, 8, time.Second, Outputs{JSON: js})
	seed, err := os.ReadFile(js)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	// A failure with its memory snapshot (oom_test.go).
	js = filepath.Join(f.TempDir(), "oom.json")
	oomReport(f, Outputs{JSON: js}, oomFailure())
	if seed, err = os.ReadFile(js); err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	// Schema 1: no history, no sites.
	f.Add([]byte(`{"version": "v0.3.0", "start": "2025-01-02T03:04:05Z", "end": "2025-01-02T03:05:05Z",
		"processes": [{"pid": 7, "comm": "w", "open_fds": 3, "fd_limit": 1024}], "findings": []}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			return
		}
		if err := WriteHTML(io.Discard, r); err != nil {
			t.Fatalf("a report read renders with %v", err)
		}
		for _, p := range r.Processes {
			if p.Sites != nil {
				_ = p.Sites.Model()
			}
		}
	})
}
