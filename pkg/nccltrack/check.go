package nccltrack

import (
	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// Check loads the NCCL object and attaches a uprobe as a run would; up is
// whether the view loads and its uprobes attach.
func Check() (rs []features.Result, up bool) {
	r := features.Result{Name: "view nccl (collective hooks)"}
	t, err := NewTracker(Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return []features.Result{r}, false
	}
	defer t.Close()
	if err := features.AttachUprobe(); err != nil {
		r.Detail = "loads, but uprobes do not attach: " + err.Error()
		return []features.Result{r}, false
	}
	r.OK, r.Detail = true, "loads; uprobes attach to the libnccl.so.2 each process maps"
	if !bpfobj.Probe().Cookies {
		r.Detail += ", one entry program per function (no uprobe cookies)"
	}
	return []features.Result{r}, true
}
