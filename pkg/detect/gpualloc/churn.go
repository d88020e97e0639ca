package gpualloc

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Churn is allocation traffic that holds nothing: a loop that calls
// cudaMalloc and cudaFree thousands of times a second for buffers it could
// keep. Each such free waits for the device to finish its queued work, so
// the cost is the pipeline stall, not memory; bursts and leaks, judged by
// memory held, stay quiet on it.

// churnState is the churn view of one process.
type churnState struct {
	ep episode.Episode
	// The latest churning interval: pairs/s, bytes allocated/s, the most
	// held at once above its start; and the most pairs/s of the finding.
	rate, byteRate float64
	held           uint64
	maxRate        float64
	// Sites with allocations of churning intervals caught live at a poll.
	// A churned buffer lives for microseconds, so they are seen now and
	// then, if at all.
	sites map[string]*churnSite
}

type churnSite struct {
	stack  []model.Frame
	caught int // allocations made there in churning intervals (recentSites)
}

func (d *Detector) observeChurn(now time.Time, p *model.Process, st *procState, iv interval, ok bool) []model.Finding {
	c := &st.churn
	churning := false
	if ok && iv.seconds > 0 {
		rate := float64(min(iv.devCalls, iv.syncFrees)) / iv.seconds
		net := max(iv.end, iv.start) - min(iv.end, iv.start)
		churning = rate >= d.cfg.ChurnRate && float64(net) <= d.cfg.ChurnFlatShare*float64(iv.bytes)
		if churning {
			c.rate, c.byteRate, c.held = rate, float64(iv.bytes)/iv.seconds, iv.rise()
			c.maxRate = max(c.maxRate, rate)
			if c.sites == nil {
				c.sites = map[string]*churnSite{}
			}
			for _, s := range recentSites(p.CUDA.Sites, iv.since) {
				cs := c.sites[s.key]
				if cs == nil {
					cs = &churnSite{stack: s.stack}
					c.sites[s.key] = cs
				}
				cs.caught += s.allocs
			}
		}
	}
	if !churning && !c.ep.Open() {
		*c = churnState{}
	}
	rule := episode.Rule{ConfirmPolls: d.cfg.ChurnConfirm, QuietPolls: d.cfg.QuietIntervals}
	return c.ep.Observe(now, model.KindGPUAllocChurn, p.PID, rule, episode.Verdict{Raise: churning},
		func(f model.Finding, active bool) model.Finding { return d.fillChurn(f, c, now, p, active) })
}

func (d *Detector) fillChurn(f model.Finding, c *churnState, now time.Time, p *model.Process, active bool) model.Finding {
	f.Comm, f.LastSeen, f.Active = p.Comm, now, active
	f.Severity = model.SeverityWarning
	keys := slices.SortedFunc(maps.Keys(c.sites), func(a, b string) int {
		return cmp.Or(cmp.Compare(c.sites[b].caught, c.sites[a].caught), cmp.Compare(a, b))
	})
	f.Stack = nil
	top := make([]model.ChurnSite, 0, topSitesShown)
	for _, k := range keys[:min(len(keys), topSitesShown)] {
		top = append(top, model.ChurnSite{Stack: slices.Clone(c.sites[k].stack), CaughtLive: c.sites[k].caught})
	}
	if len(keys) > 0 {
		f.Stack = slices.Clone(c.sites[keys[0]].stack)
	}

	var b strings.Builder
	head := "GPU allocation churn"
	if !active {
		head = "GPU allocation churn ended"
	}
	fmt.Fprintf(&b, "%s: %.0f allocate+free pairs/s (%s/s allocated, at most %s held at once); each cudaFree synchronizes the device",
		head, c.rate, human(c.byteRate), human(float64(c.held)))
	if len(keys) > 0 {
		fmt.Fprintf(&b, "; caught at %s", keys[0])
	}
	f.Summary = b.String()
	frees := map[string]uint64{}
	for _, api := range syncFreeAPIs {
		if n := p.CUDA.Calls[api]; n > 0 {
			frees[api] = n
		}
	}
	f.Evidence = model.GPUAllocChurnEvidence{
		PairsPerSecond:     math.Round(c.rate),
		MaxPairsPerSecond:  math.Round(c.maxRate),
		BytesPerSecond:     math.Round(c.byteRate),
		HeldBytes:          c.held,
		LiveBytes:          p.CUDA.LiveBytes,
		SynchronizingFrees: frees,
		TopSites:           top,
	}
	return f
}
