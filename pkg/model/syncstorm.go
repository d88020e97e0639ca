package model

// GPUSyncStormEvidence is a gpu_sync_storm's evidence: the host's waits on
// the GPU over the detector's window.
type GPUSyncStormEvidence struct {
	CallsPerSecond float64 `json:"calls_per_second"` // synchronising calls/s
	// HostWaitShare is the share of the window the thread that waited most
	// spent waiting on the GPU (CUDAWaits.Share over the window).
	HostWaitShare   float64 `json:"host_wait_share"`
	MeanWaitSeconds float64 `json:"mean_wait_seconds"`
	// ShortShare is the share of the calls that waited less than
	// ShortWaitSeconds.
	ShortShare       float64 `json:"short_share"`
	ShortWaitSeconds float64 `json:"short_wait_seconds"`
	// SMUtilizationMean is the GPU's mean SM utilization over the window;
	// null when it was not known (no NVML on the node): the storm was
	// then judged from the waits alone.
	SMUtilizationMean *float64   `json:"sm_utilization_mean"`
	TopSites          []SyncSite `json:"top_sites"`
	WindowSeconds     float64    `json:"window_seconds"`
}

// SyncSite is a call site of synchronising calls in the window.
type SyncSite struct {
	API            string  `json:"api"`
	CallShare      float64 `json:"call_share"` // of the window's calls
	CallsPerSecond float64 `json:"calls_per_second"`
	Stack          []Frame `json:"stack"`
	WaitShare      float64 `json:"wait_share"` // of the window's time waited
}

func (e GPUSyncStormEvidence) EvidenceKind() string { return KindGPUSyncStorm }

func (e GPUSyncStormEvidence) Card(c Card) {
	c.Rate("calls_per_second", "synchronisations", e.CallsPerSecond, "calls/s")
	c.Share("short_share", "shorter than the short wait", e.ShortShare)
	c.Duration("short_wait_seconds", "short wait", e.ShortWaitSeconds)
	c.Duration("mean_wait_seconds", "mean wait", e.MeanWaitSeconds)
	c.Share("host_wait_share", "host thread waiting", e.HostWaitShare)
	if e.SMUtilizationMean != nil {
		c.Share("sm_utilization_mean", "SM utilization", *e.SMUtilizationMean)
	} else {
		c.Text("sm_utilization_mean", "SM utilization", "not known (no NVML)")
	}
	c.Duration("window_seconds", "window", e.WindowSeconds)
	var sites []Row
	for _, s := range e.TopSites {
		sites = append(sites, Row{Cells: []Cell{TextCell(s.API), RateCell(s.CallsPerSecond, "calls/s"), ShareCell(s.CallShare), ShareCell(s.WaitShare)}, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", []string{"API", "calls", "of the calls", "of the time waited"}, sites)
}

func init() {
	registerEvidence[GPUSyncStormEvidence]()
}
