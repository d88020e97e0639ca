package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Evidence is the numbers behind a finding's verdict: the struct of its
// kind (FDLeakEvidence for fd_leak, ...), or RawEvidence.
//
// The fields of each struct are in the order of their JSON names, as
// Frame's: evidence was written from maps, which encode their keys sorted,
// and a report written now reads key for key as one written then. A key
// that is null when it does not apply is a pointer; one left out then is
// a pointer or a slice with omitempty. docs/REPORT.md says what each
// means (a test checks it lists these keys).
type Evidence interface {
	// EvidenceKind is the kind of finding the evidence is about.
	EvidenceKind() string
}

// FDLeakEvidence is an fd_leak's evidence.
type FDLeakEvidence struct {
	ClosedByKind    map[string]uint64 `json:"closed_by_kind"`
	GrowthPerSecond float64           `json:"growth_fds_per_second"`
	// LeakedTargets is what the top site's fds point at, set by the fd
	// view (fdtrack's Annotate) once it has read them.
	LeakedTargets    []LeakedTarget    `json:"leaked_targets,omitempty"`
	Limit            uint64            `json:"limit"`
	OpenFDs          int               `json:"open_fds"`
	OpenedByKind     map[string]uint64 `json:"opened_by_kind"`
	TimeScaleSeconds float64           `json:"time_scale_seconds"`
	// TimeToExhaustionSeconds is nil when the fds do not grow towards a
	// known limit.
	TimeToExhaustionSeconds *float64     `json:"time_to_exhaustion_seconds"`
	TopSites                []FDLeakSite `json:"top_sites"`
	WindowSeconds           float64      `json:"window_seconds"`
}

// FDLeakSite is a call site whose fds stay open.
type FDLeakSite struct {
	OldestAgeSeconds  float64 `json:"oldest_age_seconds"`
	Stack             []Frame `json:"stack"`
	UnclosedFDs       int     `json:"unclosed_fds"`
	UnclosedFDsGrowth int     `json:"unclosed_fds_growth"`
}

// LeakedTarget is a group of leaked fds by what they point at.
type LeakedTarget struct {
	FDs    int    `json:"fds"`
	Target string `json:"target"`
}

// FDExhaustedEvidence is an fd_exhausted's evidence.
type FDExhaustedEvidence struct {
	AtLimit         bool   `json:"at_limit"`
	AtLimitAtAttach bool   `json:"at_limit_at_attach"`
	Errno           string `json:"errno"`
	// FailingCall is nil until an fd-creating call failed.
	FailingCall       *FailingCall      `json:"failing_call"`
	FailuresPerSecond float64           `json:"failures_per_second"`
	FailuresTotal     map[string]uint64 `json:"failures_total"`
	Limit             uint64            `json:"limit"`
	OpenFDs           int               `json:"open_fds"`
	TopSites          []FDHoldingSite   `json:"top_sites"`
	UnattributedFDs   int               `json:"unattributed_fds"`
}

// FailingCall is the latest fd-creating call that failed.
type FailingCall struct {
	Kind       string  `json:"kind"` // of fd it tried to create (FDKinds)
	SecondsAgo float64 `json:"seconds_ago"`
	Stack      []Frame `json:"stack"`
}

// FDHoldingSite is a call site holding fds.
type FDHoldingSite struct {
	FDs              int     `json:"fds"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Stack            []Frame `json:"stack"`
}

// SocketLeakEvidence is a socket_leak's evidence.
type SocketLeakEvidence struct {
	CloseWait             int `json:"close_wait"`
	CloseWaitOlderThanMin int `json:"close_wait_older_than_min"`
	// FDGrowth is that of the fd leak these sockets explain (pkg/detect/causes);
	// nil when there is none.
	FDGrowth               *FDGrowth      `json:"fd_growth,omitempty"`
	FDLimit                uint64         `json:"fd_limit"`
	GrowthPerSecond        float64        `json:"growth_per_second"`
	MinAgeSeconds          float64        `json:"min_age_seconds"`
	OldestCloseWaitSeconds float64        `json:"oldest_close_wait_seconds"`
	OpeningStackSockets    int            `json:"opening_stack_sockets"`
	TCPByState             map[string]int `json:"tcp_by_state"`
	// TimeToFDLimitSeconds is nil when the sockets do not grow towards a
	// known fd limit.
	TimeToFDLimitSeconds *float64     `json:"time_to_fd_limit_seconds"`
	TopPairs             []SocketPair `json:"top_pairs"`
	WindowSeconds        float64      `json:"window_seconds"`
}

// SocketPair counts the CLOSE_WAIT sockets of one address pair, ephemeral
// port masked.
type SocketPair struct {
	Count  int    `json:"count"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
}

// FDGrowth is the growth of an fd leak, as its evidence had it.
type FDGrowth struct {
	FDLeakFirstSeen         time.Time `json:"fd_leak_first_seen"`
	GrowthPerSecond         float64   `json:"growth_fds_per_second"`
	Limit                   uint64    `json:"limit"`
	OpenFDs                 int       `json:"open_fds"`
	TimeToExhaustionSeconds *float64  `json:"time_to_exhaustion_seconds"`
	WindowSeconds           float64   `json:"window_seconds"`
}

// CtxSwitchStormEvidence is a ctx_switch_storm's evidence.
type CtxSwitchStormEvidence struct {
	AllowedCPUs int `json:"allowed_cpus"`
	// BaselineMean is nil until an interval has been learnt.
	BaselineMean         *float64 `json:"baseline_mean"`
	Hint                 string   `json:"hint"`
	InvoluntaryPerSecond float64  `json:"involuntary_per_second"`
	RatePerSecond        float64  `json:"rate_per_second"`
	// RunqueueP99Seconds is nil when nothing waited in the window.
	RunqueueP99Seconds    *float64     `json:"runqueue_p99_seconds"`
	RunqueueWindowSeconds float64      `json:"runqueue_window_seconds"`
	Threads               int          `json:"threads"`
	ThresholdPerSecond    float64      `json:"threshold_per_second"`
	TopThreads            []ThreadRate `json:"top_threads"`
	VoluntaryPerSecond    float64      `json:"voluntary_per_second"`
	VoluntaryRatio        float64      `json:"voluntary_ratio"`
}

// ThreadRate is a thread's context switches per second.
type ThreadRate struct {
	Name string  `json:"name"`
	Rate float64 `json:"rate"`
	TID  int     `json:"tid"`
}

// GPUAllocBurstEvidence is a gpu_alloc_burst's evidence.
type GPUAllocBurstEvidence struct {
	BaselineBytesMean    float64 `json:"baseline_bytes_mean"`
	BaselineBytesStddev  float64 `json:"baseline_bytes_stddev"`
	BurstBytes           uint64  `json:"burst_bytes"`
	BytesInWindow        uint64  `json:"bytes_in_window"`
	CallsInWindow        uint64  `json:"calls_in_window"`
	LargestBurstBytes    uint64  `json:"largest_burst_bytes"`
	LargestPeakLiveBytes uint64  `json:"largest_peak_live_bytes"`
	LiveBytes            uint64  `json:"live_bytes"`
	// NearFull is what the peak came close to; nil for nothing.
	NearFull      *string `json:"near_full"`
	Occurrences   int     `json:"occurrences"`
	PeakLiveBytes uint64  `json:"peak_live_bytes"`
	// PeriodSeconds is nil until a burst recurs.
	PeriodSeconds *float64    `json:"period_seconds"`
	StartupStep   bool        `json:"startup_step"`
	TopSites      []BurstSite `json:"top_sites"`
	WindowSeconds float64     `json:"window_seconds"`
}

// BurstSite is a call site that allocated in a burst's interval.
type BurstSite struct {
	Bytes uint64  `json:"bytes"`
	Share float64 `json:"share"` // of the interval's bytes
	Stack []Frame `json:"stack"`
}

// GPUMemoryLeakEvidence is a gpu_memory_leak's evidence.
type GPUMemoryLeakEvidence struct {
	AllocBytesSinceAttach uint64  `json:"alloc_bytes_since_attach"`
	FreeBytesSinceAttach  uint64  `json:"free_bytes_since_attach"`
	GrowthBytesPerSecond  float64 `json:"growth_bytes_per_second"`
	// HeadroomBytes and HeadroomOf are nil without NVML or a budget.
	HeadroomBytes   *uint64 `json:"headroom_bytes"`
	HeadroomOf      *string `json:"headroom_of"`
	LiveAllocations int     `json:"live_allocations"`
	LiveBytes       uint64  `json:"live_bytes"`
	// MinAgeSeconds and OldBytesAtTopSite are set on the classic window
	// only, NVMLUsedBytes and UntrackedBytes with NVML only.
	MinAgeSeconds     *float64 `json:"min_age_seconds,omitempty"`
	NVMLUsedBytes     *uint64  `json:"nvml_used_bytes,omitempty"`
	OldBytesAtTopSite *int64   `json:"old_bytes_at_top_site,omitempty"`
	TimeScaleSeconds  float64  `json:"time_scale_seconds"`
	// TimeToExhaustionSeconds is nil when no bound is known or the bytes
	// do not grow.
	TimeToExhaustionSeconds *float64      `json:"time_to_exhaustion_seconds"`
	TopSites                []GPULeakSite `json:"top_sites"`
	UntrackedBytes          *int64        `json:"untracked_bytes,omitempty"`
	WindowSeconds           float64       `json:"window_seconds"`
}

// GPULeakSite is a call site whose device allocations stay live.
type GPULeakSite struct {
	Allocations int    `json:"allocations"`
	Bytes       uint64 `json:"bytes"`
	// KeptAllocations and KeptBytes are set on the fast and slow scales,
	// OldBytesGrowth on the classic window.
	KeptAllocations  *int    `json:"kept_allocations,omitempty"`
	KeptBytes        *uint64 `json:"kept_bytes,omitempty"`
	OldBytes         int64   `json:"old_bytes"`
	OldBytesGrowth   *int64  `json:"old_bytes_growth,omitempty"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Stack            []Frame `json:"stack"`
}

// GPUAllocFailureEvidence is a gpu_alloc_failure's evidence.
type GPUAllocFailureEvidence struct {
	API          string    `json:"api"`
	Code         int       `json:"code"`
	Count        int       `json:"count"`
	Error        string    `json:"error"`
	FirstFailure time.Time `json:"first_failure"`
	LastFailure  time.Time `json:"last_failure"`
	LiveBytes    uint64    `json:"live_bytes"`
	MaxSizeBytes uint64    `json:"max_size_bytes"`
	SizeBytes    uint64    `json:"size_bytes"` // the latest
}

// GPUAllocChurnEvidence is a gpu_alloc_churn's evidence.
type GPUAllocChurnEvidence struct {
	BytesPerSecond     float64           `json:"bytes_per_second"`
	HeldBytes          uint64            `json:"held_bytes"`
	LiveBytes          uint64            `json:"live_bytes"`
	MaxPairsPerSecond  float64           `json:"max_pairs_per_second"`
	PairsPerSecond     float64           `json:"pairs_per_second"`
	SynchronizingFrees map[string]uint64 `json:"synchronizing_frees"`
	TopSites           []ChurnSite       `json:"top_sites"`
}

// ChurnSite is a call site of a churning loop.
type ChurnSite struct {
	CaughtLive int     `json:"caught_live"`
	Stack      []Frame `json:"stack"`
}

// GPUXIDEvidence is a gpu_xid's evidence.
type GPUXIDEvidence struct {
	Count        int           `json:"count"`
	Device       int           `json:"device"`
	FirstAt      time.Time     `json:"first_at"`
	LastAt       time.Time     `json:"last_at"`
	Meaning      string        `json:"meaning"`
	MIGInstances []MIGInstance `json:"mig_instances,omitempty"`
	UUID         string        `json:"uuid"`
	XID          uint64        `json:"xid"`
}

// GPUECCEvidence is a gpu_ecc_error's evidence.
type GPUECCEvidence struct {
	Count        int           `json:"count"`
	Device       int           `json:"device"`
	FirstAt      time.Time     `json:"first_at"`
	LastAt       time.Time     `json:"last_at"`
	MIGInstances []MIGInstance `json:"mig_instances,omitempty"`
	UUID         string        `json:"uuid"`
}

// MIGInstance is a MIG instance a fault was reported on.
type MIGInstance struct {
	ComputeInstance uint32 `json:"compute_instance"`
	GPUInstance     uint32 `json:"gpu_instance"`
}

// GPUInputBoundEvidence is a gpu_input_bound's evidence.
type GPUInputBoundEvidence struct {
	SMUtilizationMean float64          `json:"sm_utilization_mean"`
	StarvedShare      float64          `json:"starved_share"`
	Verdict           string           `json:"verdict"`
	Waiting           []WaitingProcess `json:"waiting"`
	WindowSeconds     float64          `json:"window_seconds"`
}

// WaitingProcess is a process that waited for a CPU while the GPU idled.
type WaitingProcess struct {
	AllowedCPUs    int             `json:"allowed_cpus"`
	Comm           string          `json:"comm"`
	PID            int             `json:"pid"`
	Role           string          `json:"role"` // "itself" or "child"
	RunqP99Seconds float64         `json:"runq_p99_seconds"`
	Threads        []WaitingThread `json:"threads"`
}

// WaitingThread is a thread of a waiting process, by how often it was
// preempted.
type WaitingThread struct {
	Name      string `json:"name"`
	Preempted uint64 `json:"preempted"`
	TID       int    `json:"tid"`
}

// RawEvidence is evidence kept as it was read, written back as it came:
// that of a kind this release does not know (a report from a newer one),
// or of a shape it does not (from an older one).
type RawEvidence struct {
	Kind string
	JSON json.RawMessage
}

func (e FDLeakEvidence) EvidenceKind() string          { return KindFDLeak }
func (e FDExhaustedEvidence) EvidenceKind() string     { return KindFDExhausted }
func (e SocketLeakEvidence) EvidenceKind() string      { return KindSocketLeak }
func (e CtxSwitchStormEvidence) EvidenceKind() string  { return KindCtxSwitchStorm }
func (e GPUAllocBurstEvidence) EvidenceKind() string   { return KindGPUAllocBurst }
func (e GPUMemoryLeakEvidence) EvidenceKind() string   { return KindGPUMemoryLeak }
func (e GPUAllocFailureEvidence) EvidenceKind() string { return KindGPUAllocFailure }
func (e GPUAllocChurnEvidence) EvidenceKind() string   { return KindGPUAllocChurn }
func (e GPUXIDEvidence) EvidenceKind() string          { return KindGPUXID }
func (e GPUECCEvidence) EvidenceKind() string          { return KindGPUECCError }
func (e GPUInputBoundEvidence) EvidenceKind() string   { return KindGPUInputBound }
func (e RawEvidence) EvidenceKind() string             { return e.Kind }

// MarshalJSON writes the evidence as it was read.
func (e RawEvidence) MarshalJSON() ([]byte, error) { return e.JSON.MarshalJSON() }

// evidenceDecoders read the evidence of each kind.
var evidenceDecoders = map[string]func([]byte) (Evidence, error){
	KindFDLeak:          decodeEvidence[FDLeakEvidence],
	KindFDExhausted:     decodeEvidence[FDExhaustedEvidence],
	KindSocketLeak:      decodeEvidence[SocketLeakEvidence],
	KindCtxSwitchStorm:  decodeEvidence[CtxSwitchStormEvidence],
	KindGPUAllocBurst:   decodeEvidence[GPUAllocBurstEvidence],
	KindGPUMemoryLeak:   decodeEvidence[GPUMemoryLeakEvidence],
	KindGPUAllocFailure: decodeEvidence[GPUAllocFailureEvidence],
	KindGPUAllocChurn:   decodeEvidence[GPUAllocChurnEvidence],
	KindGPUXID:          decodeEvidence[GPUXIDEvidence],
	KindGPUECCError:     decodeEvidence[GPUECCEvidence],
	KindGPUInputBound:   decodeEvidence[GPUInputBoundEvidence],
}

// decodeEvidence reads evidence of type T. A key T lacks is an error: the
// evidence is then not T's, and would lose it; so is a key T always writes
// that the evidence lacks (one from an older release): T would show it as
// a zero it never had.
func decodeEvidence[T Evidence](data []byte) (Evidence, error) {
	var ev T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return nil, err
	}
	again, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if key := invented(data, again); key != "" {
		return nil, fmt.Errorf("evidence lacks %q", key)
	}
	return ev, nil
}

// invented returns a key written has and read lacks, looking into objects
// and lists alike but not into stacks (frames read from text are objects
// written); "" for none.
func invented(read, written json.RawMessage) string {
	w := bytes.TrimSpace(written)
	if len(w) == 0 {
		return ""
	}
	switch w[0] {
	case '{':
		var wm, rm map[string]json.RawMessage
		if json.Unmarshal(w, &wm) != nil {
			return ""
		}
		_ = json.Unmarshal(read, &rm) // not an object: every key is missing
		for k, v := range wm {
			rv, ok := rm[k]
			if !ok {
				return k
			}
			if k == "stack" {
				continue
			}
			if key := invented(rv, v); key != "" {
				return k + "." + key
			}
		}
	case '[':
		var wl, rl []json.RawMessage
		if json.Unmarshal(w, &wl) != nil {
			return ""
		}
		_ = json.Unmarshal(read, &rl)
		for i, v := range wl {
			if i < len(rl) {
				if key := invented(rl[i], v); key != "" {
					return key
				}
			}
		}
	}
	return ""
}

// readEvidence reads the evidence of a finding of kind: nil for none (null,
// or the {} a finding without evidence is written with), RawEvidence for
// what this release cannot read.
func readEvidence(kind string, data json.RawMessage) Evidence {
	var c bytes.Buffer
	if len(data) == 0 || json.Compact(&c, data) == nil && (c.String() == "null" || c.String() == "{}") {
		return nil
	}
	if decode, ok := evidenceDecoders[kind]; ok {
		if ev, err := decode(data); err == nil {
			return ev
		}
	}
	return RawEvidence{Kind: kind, JSON: data}
}

// MarshalJSON writes a finding without evidence with "evidence": {}, so
// that consumers need no null check (docs/REPORT.md).
func (f Finding) MarshalJSON() ([]byte, error) {
	type plain Finding // without the method
	if f.Evidence == nil {
		f.Evidence = RawEvidence{Kind: f.Kind, JSON: json.RawMessage("{}")}
	}
	return json.Marshal(plain(f))
}

// UnmarshalJSON reads a finding, its evidence into the struct of its kind.
func (f *Finding) UnmarshalJSON(data []byte) error {
	type plain Finding // without the method
	var v struct {
		plain
		Evidence json.RawMessage `json:"evidence"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*f = Finding(v.plain)
	f.Evidence = readEvidence(f.Kind, v.Evidence)
	return nil
}
