package profiles

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/atomicfile"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Writer is a sink that writes, when closed, the profiles of every process
// it saw into a folder: DIR/PID-gpu.pb.gz and DIR/PID-fd.pb.gz, each only
// when it has a sample. A process is profiled as of its last snapshot
// alive: by the snapshot that says it exited, its fds are gone.
type Writer struct {
	dir   string
	procs model.LastAlive // first seen first: a reused pid's last process wins
	// Written lists the files Close wrote.
	Written []string
}

// NewWriter returns a Writer into dir, which must exist.
func NewWriter(dir string) *Writer {
	return &Writer{dir: dir}
}

// Update keeps each process's latest state.
func (w *Writer) Update(s *model.Snapshot) { w.procs.Update(s) }

// Close writes the profiles, final included.
func (w *Writer) Close(final *model.Snapshot) error {
	now := time.Now()
	if final != nil {
		w.Update(final)
		now = final.Time
	}
	var errs []error
	for _, p := range w.procs.All() {
		for _, kind := range Kinds {
			if err := w.write(kind, p, now); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (w *Writer) write(kind string, p *model.Process, now time.Time) error {
	prof, err := Of(kind, p, now)
	if err != nil {
		return fmt.Errorf("%s profile of pid %d: %w", kind, p.PID, err)
	}
	if len(prof.Sample) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := prof.Write(&buf); err != nil { // gzipped
		return fmt.Errorf("%s profile of pid %d: %w", kind, p.PID, err)
	}
	path := filepath.Join(w.dir, FileName(p.PID, kind))
	if err := atomicfile.Write(path, buf.Bytes()); err != nil {
		return err
	}
	w.Written = append(w.Written, path)
	return nil
}

// FileName is the name of a process's profile of kind in --pprof's folder.
func FileName(pid int, kind string) string {
	return strconv.Itoa(pid) + "-" + kind + ".pb.gz"
}

// Kinds lists the kinds of profile.
var Kinds = []string{GPU, FD, Wait}
