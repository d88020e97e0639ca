package profiles

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/atomicfile"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Writer is a sink that writes, when closed, the profiles of every process
// it saw into a folder: DIR/PID-gpu.pb.gz, DIR/PID-fd.pb.gz and
// DIR/PID-wait.pb.gz, each only when it has a sample. A process is
// profiled as of its last snapshot alive: by the snapshot that says it
// exited, its fds are gone.
//
// The profile of each memory snapshot taken at a failed allocation
// (DIR/OOMFileName) it writes as soon as a snapshot of the model has it,
// once: the process often dies of the failure, and the run may be killed
// with it before Close.
type Writer struct {
	dir   string
	procs model.LastAlive // first seen first: a reused pid's last process wins
	// oom holds the snapshots at failures already written (or whose
	// writing failed: tried once), by process and time.
	oom  map[oomKey]bool
	errs []error // of writing them
	// Written lists the files written, in order.
	Written []string
}

// oomKey is a snapshot at a failure: its process (a reused pid is
// another) and its time.
type oomKey struct {
	pid           int
	started, time int64
}

// NewWriter returns a Writer into dir, which must exist.
func NewWriter(dir string) *Writer {
	return &Writer{dir: dir}
}

// Update keeps each process's latest state, and writes the profiles of
// snapshots at failures not written yet.
func (w *Writer) Update(s *model.Snapshot) {
	w.procs.Update(s)
	for _, p := range s.Processes {
		for _, snap := range p.CUDA.Snapshots {
			k := oomKey{p.PID, p.Started.UnixNano(), snap.Time.UnixNano()}
			if w.oom[k] {
				continue
			}
			if w.oom == nil {
				w.oom = map[oomKey]bool{}
			}
			w.oom[k] = true
			if err := w.writeOOM(p, snap); err != nil {
				// Said now: the run may not reach Close.
				slog.Warn("profile of a memory snapshot not written", "err", err)
				w.errs = append(w.errs, err)
			}
		}
	}
}

func (w *Writer) writeOOM(p *model.Process, snap *model.GPUMemorySnapshot) error {
	prof, err := OfSnapshot(p.PID, p.Comm, snap)
	if err != nil {
		return fmt.Errorf("profile of pid %d's memory at its failure at %s: %w", p.PID, snap.Time.UTC().Format(OOMTimeLayout), err)
	}
	return w.save(prof, filepath.Join(w.dir, OOMFileName(p.PID, snap.Time)))
}

// Close writes the profiles, final included.
func (w *Writer) Close(final *model.Snapshot) error {
	now := time.Now()
	if final != nil {
		w.Update(final)
		now = final.Time
	}
	errs := w.errs
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
	if err := w.save(prof, filepath.Join(w.dir, FileName(p.PID, kind))); err != nil {
		return fmt.Errorf("%s profile of pid %d: %w", kind, p.PID, err)
	}
	return nil
}

// save writes prof, gzipped, to path, and lists it in Written.
func (w *Writer) save(prof *profile.Profile, path string) error {
	var buf bytes.Buffer
	if err := prof.Write(&buf); err != nil { // gzipped
		return err
	}
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
