// Package report writes the JSON report of a run; docs/REPORT.md describes
// the schema.
package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Report is the document written when the run ends.
type Report struct {
	Version         string            `json:"version"`
	Start           time.Time         `json:"start"`
	End             time.Time         `json:"end"`
	DurationSeconds float64           `json:"duration_seconds"`
	Targets         []int             `json:"targets"`
	Processes       []Process         `json:"processes"`
	Findings        []model.Finding   `json:"findings"`
	LostEvents      map[string]uint64 `json:"lost_events"`
	GPUs            []GPU             `json:"gpus"`
}

// GPU is one device as NVML last reported it.
type GPU struct {
	Index            int     `json:"index"`
	UUID             string  `json:"uuid"`
	Name             string  `json:"name"`
	MemoryUsedBytes  uint64  `json:"memory_used_bytes"`
	MemoryTotalBytes uint64  `json:"memory_total_bytes"`
	UtilizationRatio float64 `json:"utilization_ratio"`
	// Device memory by pid, every process NVML lists, watched or not.
	ProcessMemoryUsedBytes map[int]uint64 `json:"process_memory_used_bytes"`
}

// CUDA is the GPU-allocation view of a process that used CUDA.
type CUDA struct {
	LiveBytes  uint64            `json:"live_bytes"`
	AllocBytes map[string]uint64 `json:"alloc_bytes"` // by API
	FreeBytes  map[string]uint64 `json:"free_bytes"`  // by API
	AllocCalls map[string]uint64 `json:"alloc_calls"` // by API
	Failures   int               `json:"failures"`
	// NVML's figures; absent when NVML does not list the process.
	NVMLUsedBytes  *uint64  `json:"nvml_used_bytes,omitempty"`
	UntrackedBytes *int64   `json:"untracked_bytes,omitempty"`
	Libraries      []string `json:"libraries"`
}

// Process is the last known state of one watched process.
type Process struct {
	PID       int               `json:"pid"`
	Comm      string            `json:"comm"`
	Exited    bool              `json:"exited"`
	OpenFDs   int               `json:"open_fds"`
	FDLimit   uint64            `json:"fd_limit"`
	FDsOpened map[string]uint64 `json:"fds_opened"`
	FDsClosed map[string]uint64 `json:"fds_closed"`
	CUDA      *CUDA             `json:"cuda,omitempty"` // absent without CUDA activity

	// TCP sockets held by state, and socket fds by kind; {} without the
	// socket concern.
	TCPSocketsByState map[string]int `json:"tcp_sockets_by_state"`
	SocketFDsByKind   map[string]int `json:"socket_fds_by_kind"`

	// Context switches since attach, and the p99 run-queue wait in seconds
	// (null when no wait was seen).
	ContextSwitches    ContextSwitches `json:"context_switches"`
	RunqueueP99Seconds *float64        `json:"runqueue_p99_seconds"`
}

// processKey tells apart two processes that had the same pid in one run.
type processKey struct {
	pid     int
	started int64
}

// Writer is a sink that writes the report when it is closed.
type Writer struct {
	path    string
	version string
	stdout  io.Writer // where path "-" writes; a field so that tests can read it
	created time.Time // the run's start if no snapshot ever arrives
	last    *model.Snapshot
	// Every process ever seen: processes drop out of snapshots after they
	// exit, but the report must still show them.
	procs map[processKey]Process
}

// New returns a Writer for path; "-" means standard output.
func New(path, version string) *Writer {
	return &Writer{
		path:    path,
		version: version,
		stdout:  os.Stdout,
		created: time.Now(),
		procs:   map[processKey]Process{},
	}
}

// Update records s as the latest state.
func (w *Writer) Update(s *model.Snapshot) {
	w.last = s
	for _, p := range s.Processes {
		// Copied: the report is written long after this snapshot.
		w.procs[processKey{p.PID, p.Started.UnixNano()}] = Process{
			PID:       p.PID,
			Comm:      p.Comm,
			Exited:    p.Exited,
			OpenFDs:   p.FD.Open,
			FDLimit:   p.FD.Limit,
			FDsOpened: copyCounts(p.FD.Opened),
			FDsClosed: copyCounts(p.FD.Closed),
			CUDA:      cudaOf(&p.CUDA),

			TCPSocketsByState: copyInts(p.Sock.TCPByState),
			SocketFDsByKind:   copyInts(p.Sock.ByKind),

			ContextSwitches:    ContextSwitches{Voluntary: p.Sched.Voluntary, Involuntary: p.Sched.Involuntary},
			RunqueueP99Seconds: p99(p.Sched.RunqLatency),
		}
	}
}

// Close records final, if any, and writes the report. A file is replaced
// atomically, so that a reader never sees half a report.
func (w *Writer) Close(final *model.Snapshot) error {
	if final != nil {
		w.Update(final)
	}
	data, err := json.MarshalIndent(w.report(time.Now()), "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	data = append(data, '\n')
	if w.path == "-" {
		_, err = w.stdout.Write(data)
	} else {
		err = writeAtomic(w.path, data)
	}
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// report builds the document; now ends a run that produced no snapshot.
func (w *Writer) report(now time.Time) *Report {
	r := &Report{
		Version:    w.version,
		Start:      w.created,
		End:        now,
		Targets:    []int{},
		Processes:  w.processes(),
		Findings:   []model.Finding{},
		LostEvents: map[string]uint64{},
		GPUs:       []GPU{},
	}
	if s := w.last; s != nil {
		r.Start, r.End = s.Start, s.Time
		r.Targets = append(r.Targets, s.Targets...)
		maps.Copy(r.LostEvents, s.Lost)
		for _, g := range s.GPUs {
			r.GPUs = append(r.GPUs, GPU{
				Index: g.Index, UUID: g.UUID, Name: g.Name,
				MemoryUsedBytes: g.MemoryUsed, MemoryTotalBytes: g.MemoryTotal, UtilizationRatio: g.Utilization,
				ProcessMemoryUsedBytes: maps.Clone(g.Processes),
			})
		}
		for _, f := range s.Findings {
			// Consumers index into these; [] and {} spare them null checks.
			if f.Stack == nil {
				f.Stack = []string{}
			}
			if f.Evidence == nil {
				f.Evidence = map[string]any{}
			}
			r.Findings = append(r.Findings, f)
		}
	}
	r.DurationSeconds = r.End.Sub(r.Start).Seconds()
	return r
}

// processes returns every process seen, by pid; a reused pid in the order
// the processes started.
func (w *Writer) processes() []Process {
	keys := slices.SortedFunc(maps.Keys(w.procs), func(a, b processKey) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.started, b.started))
	})
	out := make([]Process, 0, len(keys))
	for _, k := range keys {
		out = append(out, w.procs[k])
	}
	return out
}

// cudaOf copies the CUDA view of a process, or nil if it shows no activity.
func cudaOf(c *model.CUDAStats) *CUDA {
	if !c.Active() {
		return nil
	}
	out := &CUDA{
		LiveBytes:  c.LiveBytes,
		AllocBytes: copyCounts(c.AllocBytes),
		FreeBytes:  copyCounts(c.FreeBytes),
		AllocCalls: copyCounts(c.AllocCalls),
		Failures:   len(c.Failures),
		Libraries:  append([]string{}, c.Libraries...),
	}
	if c.HasNVML {
		used, untracked := c.NVMLUsedBytes, c.UntrackedBytes
		out.NVMLUsedBytes, out.UntrackedBytes = &used, &untracked
	}
	return out
}

// copyCounts copies m; nil becomes empty, so that the JSON shows {}.
func copyCounts(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	maps.Copy(out, m)
	return out
}

// copyInts copies m; nil becomes empty, so that the JSON shows {}.
func copyInts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	maps.Copy(out, m)
	return out
}

// writeAtomic writes data to a temporary file next to path and renames it
// over path: a rename within one file system is atomic.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		// CreateTemp makes the file 0600; the tool runs as root and the
		// report is meant for the user who asked for it.
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
