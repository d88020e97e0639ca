package cudatrack

import (
	ebpffeatures "github.com/cilium/ebpf/features"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// Check loads the CUDA object and attaches a uprobe as a run would, and
// lists the hooked functions of the CUDA libraries installed here; up is
// whether the view loads and its uprobes attach.
func Check() (rs []features.Result, up bool) {
	view := cuda()
	return append([]features.Result{view}, cudaHooks()...), view.OK
}

// cuda loads the CUDA object as a run would, and attaches a uprobe as it
// does to each process.
func cuda() features.Result {
	r := features.Result{Name: "view cuda (allocation hooks)"}
	t, err := NewTracker(Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return r
	}
	defer t.Close()
	if err := features.AttachUprobe(); err != nil {
		r.Detail = "loads, but uprobes do not attach: " + err.Error()
		return r
	}
	r.OK, r.Detail = true, "loads; uprobes attach; hooks: "+t.AttachPath()
	if !bpfobj.Probe().Cookies {
		r.Detail += ", one entry program per function (no uprobe cookies)"
	}
	return r
}

// cudaHooks lists, for the CUDA runtime and driver libraries installed here,
// which hooked functions each defines. A missing function (older library) or
// library is reported, never fatal: hooks attach to whatever a process maps.
func cudaHooks() []features.Result {
	libs, err := SystemLibraries()
	multi := features.Result{Name: "uprobe_multi links (CUDA hooks)", Detail: "present"}
	if merr := ebpffeatures.HaveBPFLinkUprobeMulti(); merr != nil {
		multi.Detail = "unavailable (" + merr.Error() + "): one uprobe per function, slow to detach"
	} else {
		multi.OK = true
	}
	rs := []features.Result{multi}
	if err != nil {
		rs = append(rs, features.Result{Name: "CUDA libraries", Detail: err.Error()})
	}
	for _, layer := range []struct{ layer, kind, name string }{
		{LayerRuntime, "runtime", "libcudart.so"},
		{LayerDriver, "driver", "libcuda.so.1"},
	} {
		found := false
		for _, lib := range libs {
			if lib.Kind != layer.kind {
				continue
			}
			found = true
			missing := map[string]bool{}
			for _, m := range lib.Missing {
				missing[m] = true
			}
			for _, fn := range LayerSymbols(layer.layer) {
				r := features.Result{Name: "CUDA hook " + fn, OK: !missing[fn], Detail: lib.Path}
				if missing[fn] {
					r.Detail = "not in " + lib.Path + " (older version): not hooked"
				}
				rs = append(rs, r)
			}
		}
		if !found {
			rs = append(rs, features.Result{Name: "CUDA " + layer.kind + " (" + layer.name + ")", Detail: "not installed in the standard places; hooks attach to the copy a process maps"})
		}
	}
	return rs
}
