// Package report writes the report of a run, as JSON (docs/REPORT.md
// describes the schema) and as a self-contained HTML page with charts.
package report

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/atomicfile"
	"github.com/open-autoglm/autoglm-ebpf/pkg/history"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// SchemaVersion is the version of the report's format, bumped when its
// meaning changes: 2 added history (schema 1 reports have no
// schema_version field), 3 made stack frames objects (model.Frame; Read
// still takes the strings of earlier reports).
const SchemaVersion = 3

// Report is the document written when the run ends.
type Report struct {
	SchemaVersion   int               `json:"schema_version"`
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
	// The share of the time its memory was read or written, and whether
	// it keeps per-process utilization samples.
	MemoryUtilizationRatio float64 `json:"memory_utilization_ratio"`
	PerProcessUtilization  bool    `json:"per_process_utilization"`
	// On a MIG instance, its index on the GPU Index, whose own entry
	// lists no processes: they are the instances'.
	MIGDevice *int `json:"mig_device,omitempty"`
	// Device memory by pid, every process NVML lists, watched or not.
	ProcessMemoryUsedBytes map[int]uint64 `json:"process_memory_used_bytes"`
	// Used memory over the run.
	History *history.History `json:"history,omitempty"`
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
	// How busy it kept each device over its last poll interval; absent
	// without NVML or a device.
	GPUUtilization []GPUUtil `json:"gpu_utilization,omitempty"`
	// What held the GPU back over the last window: gpu_bound,
	// input_bound; absent when neither or not known.
	Verdict string `json:"verdict,omitempty"`
	// What the host did over the verdict's window; absent without a
	// verdict or where the host's waits on the GPU are not known.
	VerdictHost *VerdictHost `json:"verdict_host,omitempty"`
	// The host's waits on the GPU in synchronising calls; absent without
	// any. By call site: Sites.Wait.
	Waits *Waits `json:"waits,omitempty"`
	// Kernel launches by API; absent without --launches.
	Launches map[string]uint64 `json:"launches,omitempty"`
}

// VerdictHost is model.VerdictHost in the report.
type VerdictHost struct {
	Confirmed bool    `json:"confirmed"`
	WaitShare float64 `json:"wait_share"`
}

// Waits is model.CUDAWaits in the report, without its sites.
type Waits struct {
	Calls      uint64   `json:"calls"`
	Seconds    float64  `json:"seconds"`
	P50Seconds *float64 `json:"p50_seconds"` // upper bounds of the histogram's buckets
	P99Seconds *float64 `json:"p99_seconds"`
	// The busiest thread's share of the last poll interval, 0–1.
	Share   float64      `json:"share"`
	Threads []WaitThread `json:"threads"`
}

// WaitThread is model.ThreadWait in the report.
type WaitThread struct {
	TID     int     `json:"tid"`
	Name    string  `json:"name"`
	Calls   uint64  `json:"calls"`
	Seconds float64 `json:"seconds"`
	Share   float64 `json:"share"`
}

// quantile is h's q-quantile, nil for an empty histogram.
func quantile(h model.Histogram, q float64) *float64 {
	v, ok := h.Quantile(q)
	if !ok {
		return nil
	}
	return &v
}

// NCCL is the collectives view of a process that is a rank of an NCCL
// communicator.
type NCCL struct {
	Library string     `json:"library"`
	Comms   []NCCLComm `json:"communicators"`
}

// NCCLComm is one communicator as this rank saw it (model.NCCLComm).
type NCCLComm struct {
	// ID is the same in every rank on every node; "" for one set up
	// before tracking began (rank and nranks -1 then, and for a split).
	ID     string            `json:"id"`
	Rank   int               `json:"rank"`
	NRanks int               `json:"nranks"`
	Calls  map[string]uint64 `json:"calls"` // by operation
	Bytes  map[string]uint64 `json:"bytes"` // by operation
	// The last call: absent before any.
	LastTime  *time.Time `json:"last_time,omitempty"`
	LastOp    string     `json:"last_op,omitempty"`
	LastStack []string   `json:"last_stack,omitempty"` // innermost first
	Destroyed bool       `json:"destroyed"`
}

// GPUUtil is model.GPUUtil in the report.
type GPUUtil struct {
	Device int     `json:"device"`
	MIG    *int    `json:"mig_device,omitempty"` // on a MIG instance, its index on the GPU
	UUID   string  `json:"uuid,omitempty"`
	SM     float64 `json:"sm"`
	Memory float64 `json:"memory"`
	Source string  `json:"source"`
}

// Process is the last known state of one watched process.
type Process struct {
	PID       int               `json:"pid"`
	Comm      string            `json:"comm"`
	Started   time.Time         `json:"started"` // when watching it began
	Exited    bool              `json:"exited"`
	OpenFDs   int               `json:"open_fds"`
	FDLimit   uint64            `json:"fd_limit"`
	FDsOpened map[string]uint64 `json:"fds_opened"`
	FDsClosed map[string]uint64 `json:"fds_closed"`
	CUDA      *CUDA             `json:"cuda,omitempty"` // absent without CUDA activity
	NCCL      *NCCL             `json:"nccl,omitempty"` // absent for a process that is no NCCL rank

	// TCP sockets held by state, and socket fds by kind; {} without the
	// socket concern.
	TCPSocketsByState map[string]int `json:"tcp_sockets_by_state"`
	SocketFDsByKind   map[string]int `json:"socket_fds_by_kind"`

	// Context switches since attach, and the p99 run-queue wait in seconds
	// (null when no wait was seen).
	ContextSwitches    ContextSwitches `json:"context_switches"`
	RunqueueP99Seconds *float64        `json:"runqueue_p99_seconds"`

	// The figures above and more, at each interval of the run.
	History *history.History `json:"history,omitempty"`

	// Call sites as of the last snapshot alive; absent without any.
	Sites *Sites `json:"sites,omitempty"`
}

// processKey tells apart two processes that had the same pid in one run.
type processKey struct {
	pid     int
	started int64
}

// Outputs says where a Writer writes the report; an empty path is not
// written.
type Outputs struct {
	JSON string // "-" is standard output
	HTML string
}

// Writer is a sink that writes the report when it is closed.
type Writer struct {
	out     Outputs
	version string
	stdout  io.Writer // where path "-" writes; a field so that tests can read it
	created time.Time // the run's start if no snapshot ever arrives
	last    *model.Snapshot
	// Every process ever seen: processes drop out of snapshots after they
	// exit, but the report must still show them.
	procs map[processKey]Process
	// alive is each process's last snapshot alive, for its sites.
	alive model.LastAlive
	hist  *history.Recorder
}

// New returns a Writer to out, recording history with the default bounds.
func New(version string, out Outputs) *Writer {
	return &Writer{
		out:     out,
		version: version,
		stdout:  os.Stdout,
		created: time.Now(),
		procs:   map[processKey]Process{},
		hist:    history.New(history.DefaultConfig()),
	}
}

// Update records s as the latest state, and its figures in the history.
func (w *Writer) Update(s *model.Snapshot) {
	w.hist.Update(s)
	w.record(s)
}

// record keeps s as the latest state.
func (w *Writer) record(s *model.Snapshot) {
	w.last = s
	w.alive.Update(s)
	for _, p := range s.Processes {
		k := processKey{p.PID, p.Started.UnixNano()}
		// Copied: the report is written long after this snapshot.
		w.procs[k] = Process{
			PID:       p.PID,
			Comm:      p.Comm,
			Started:   p.Started,
			Exited:    p.Exited,
			OpenFDs:   p.FD.Open,
			FDLimit:   p.FD.Limit,
			FDsOpened: copyCounts(p.FD.Opened),
			FDsClosed: copyCounts(p.FD.Closed),
			CUDA:      cudaOf(&p.CUDA),
			NCCL:      ncclOf(&p.NCCL),

			TCPSocketsByState: copyInts(p.Sock.TCPByState),
			SocketFDsByKind:   copyInts(p.Sock.ByKind),

			ContextSwitches:    ContextSwitches{Voluntary: p.Sched.Voluntary, Involuntary: p.Sched.Involuntary},
			RunqueueP99Seconds: p99(p.Sched.RunqLatency),
		}
	}
}

// Close records final, if any, and writes the report to each output. A
// file is replaced atomically, so that a reader never sees half a report.
func (w *Writer) Close(final *model.Snapshot) error {
	var errs []error
	if final != nil {
		w.record(final)
	}
	// The final snapshot repeats the last poll's figures: it ends the
	// report, not the history.
	if err := w.hist.Close(final); err != nil {
		errs = append(errs, err)
	}
	r := w.report(time.Now())
	if w.out.JSON != "" {
		if err := w.writeJSON(r); err != nil {
			errs = append(errs, fmt.Errorf("report: %w", err))
		}
	}
	if w.out.HTML != "" {
		if err := WriteHTMLFile(w.out.HTML, r); err != nil {
			errs = append(errs, fmt.Errorf("HTML report: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (w *Writer) writeJSON(r *Report) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if w.out.JSON == "-" {
		_, err = w.stdout.Write(data)
		return err
	}
	return atomicfile.Write(w.out.JSON, data)
}

// report builds the document; now ends a run that produced no snapshot.
func (w *Writer) report(now time.Time) *Report {
	r := &Report{
		SchemaVersion: SchemaVersion,
		Version:       w.version,
		Start:         w.created,
		End:           now,
		Targets:       []int{},
		Processes:     w.processes(),
		Findings:      []model.Finding{},
		LostEvents:    map[string]uint64{},
		GPUs:          []GPU{},
	}
	if s := w.last; s != nil {
		r.Start, r.End = s.Start, s.Time
		r.Targets = append(r.Targets, s.Targets...)
		maps.Copy(r.LostEvents, s.Lost)
		for _, g := range s.GPUs {
			r.GPUs = append(r.GPUs, GPU{
				Index: g.Index, MIGDevice: g.MIG, UUID: g.UUID, Name: g.Name,
				MemoryUsedBytes: g.MemoryUsed, MemoryTotalBytes: g.MemoryTotal, UtilizationRatio: g.Utilization,
				MemoryUtilizationRatio: g.MemoryUtilization, PerProcessUtilization: g.PerProcessUtil,
				ProcessMemoryUsedBytes: maps.Clone(g.Processes),
				History:                w.hist.GPU(g.UUID, g.Index),
			})
		}
		for _, f := range s.Findings {
			// Consumers index into these; [] spares them null checks, as
			// the {} a finding without evidence is written with does.
			if f.Stack == nil {
				f.Stack = []model.Frame{}
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
		p := w.procs[k]
		p.History = w.hist.Process(p.PID, p.Started)
		p.Sites = sitesOf(w.alive.Of(p.PID, p.Started))
		out = append(out, p)
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
	for _, u := range c.GPUUtil {
		out.GPUUtilization = append(out.GPUUtilization, GPUUtil(u))
	}
	out.Verdict = c.Verdict
	if h := c.VerdictHost; h != nil {
		out.VerdictHost = &VerdictHost{Confirmed: h.Confirmed, WaitShare: h.WaitShare}
	}
	if w := c.Waits; w.Calls > 0 {
		out.Waits = &Waits{Calls: w.Calls, Seconds: w.Seconds, P50Seconds: quantile(w.Histogram, 0.5), P99Seconds: quantile(w.Histogram, 0.99), Share: w.Share, Threads: []WaitThread{}}
		for _, t := range w.Threads {
			out.Waits.Threads = append(out.Waits.Threads, WaitThread(t))
		}
	}
	if c.Launches != nil {
		out.Launches = copyCounts(c.Launches.Calls)
	}
	return out
}

// ncclOf copies the NCCL view of a process, or nil if it is no rank.
func ncclOf(n *model.NCCLStats) *NCCL {
	if !n.Active() {
		return nil
	}
	out := &NCCL{Library: n.Library}
	for _, c := range n.Comms {
		rc := NCCLComm{ID: c.ID, Rank: c.Rank, NRanks: c.NRanks, Calls: copyCounts(c.Calls), Bytes: copyCounts(c.Bytes),
			LastOp: c.LastOp, Destroyed: c.Destroyed}
		if !c.LastTime.IsZero() {
			t := c.LastTime
			rc.LastTime = &t
		}
		for _, f := range c.LastStack {
			rc.LastStack = append(rc.LastStack, f.String())
		}
		out.Comms = append(out.Comms, rc)
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
