package socktrack

import (
	"path/filepath"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
)

// Check reports the tracepoint socket tracking cannot do without, and
// loads and attaches the socket object as a run would; up is whether the
// view loads.
func Check() (rs []features.Result, up bool) {
	if root, _, err := tracefs.Ensure(); err == nil {
		group, event := filepath.Split(Tracepoint)
		r := features.Result{Name: "tracepoint " + Tracepoint, OK: tracefs.EventExists(root, filepath.Clean(group), event), Detail: "present"}
		if !r.OK {
			r.Detail = "missing: TCP sockets (CLOSE_WAIT leaks) are not tracked"
		}
		rs = append(rs, r)
	}
	r := features.Result{Name: "view sock (TCP socket states)"}
	t, err := New(Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return append(rs, r), false
	}
	defer t.Close()
	r.OK, r.Detail = true, "loads and attaches"
	return append(rs, r), true
}
