package fdtrack

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The kernel's per-site counters, tracked from before exec: hold_open
// opens 10 fds and keeps them, try_open opens and closes one 20 times a
// second. The first site holds 10 of 10 opened; the second, holding at
// most one, counts every open and close, and shows as a past site when
// it holds none.
func TestSiteCounts(t *testing.T) {
	c := newConcern(t)
	p := fdworkFromExec(t, c, "near", "64", "10", "30")
	has := func(s model.FDSite, fn string) bool {
		return slices.ContainsFunc(s.Stack, func(f model.Frame) bool { return f.Function == fn })
	}
	for poll := 0; ; poll++ {
		if poll == 10 {
			t.Fatalf("after %d polls: sites %+v, past sites %+v", poll, p.FD.Sites, p.FD.PastSites)
		}
		// Measurement window: a poll interval, in which try_open opens
		// and closes 20 fds.
		time.Sleep(time.Second)
		if _, err := c.Observe(time.Now(), []*model.Process{p}); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(p.FD.Sites, func(s model.FDSite) bool { return has(s, "hold_open") })
		if i < 0 {
			continue
		}
		if s := p.FD.Sites[i]; len(s.Opened) != 10 || s.OpenedTotal != 10 || s.ClosedTotal != 0 {
			t.Fatalf("hold_open: %d open, %d opened, %d closed; want 10, 10, 0", len(s.Opened), s.OpenedTotal, s.ClosedTotal)
		}
		j := slices.IndexFunc(p.FD.PastSites, func(s model.FDSite) bool { return has(s, "try_open") })
		if j < 0 {
			continue // try_open's fd was open at the poll
		}
		s := p.FD.PastSites[j]
		if s.OpenedTotal < 20 || s.ClosedTotal != s.OpenedTotal || len(s.Opened) != 0 {
			t.Fatalf("try_open: %d opened, %d closed, %d open; want 20 or more opened, all closed", s.OpenedTotal, s.ClosedTotal, len(s.Opened))
		}
		t.Logf("poll %d: try_open opened and closed %d", poll, s.OpenedTotal)
		return
	}
}

// siteRounds opens and closes one fd in each of site_FIRST..site_LAST (one
// Python function each: a call site each) at each SIGUSR1, then prints
// "done".
const siteRounds = `
import os, signal, sys
for i in range(16):
    exec(f"def site_{i}():\n    os.close(os.open('/dev/null', os.O_RDONLY))\n")
def round(first, last):
    for i in range(first, last + 1):
        globals()[f"site_{i}"]()
rounds = [(int(a), int(b)) for a, b in (r.split("-") for r in sys.argv[1:])]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
print("ready", flush=True)
for first, last in rounds:
    signal.sigwait([signal.SIGUSR1])
    round(first, last)
    print("done", flush=True)
signal.sigwait([signal.SIGUSR1])
`

// A process holds at most its cap of sites in the kernel at once; sites
// with nothing open and nothing new are taken away, their totals kept, so
// that new ones fit: with a cap of 4, six sites used once keep four and
// count the other two's opens and closes lost; a poll later the four are taken away, and four new
// sites fit, while the first four keep their counts.
func TestSitesCappedAndSwept(t *testing.T) {
	testutil.RequireRoot(t)
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	sym := symbolize.New("/proc")
	svc, err := stacks.New(stacks.Config{Proc: proc, Symbolizer: sym, MaxSitesPerProc: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	c, err := NewConcern(Config{ProcRoot: "/proc", Stacks: svc}, sym, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	p := testutil.StartProc(t, nil, testutil.DebianPython, "-c", siteRounds, "0-5", "6-9")
	pr := &model.Process{PID: p.Cmd.Process.Pid}
	if err := c.Track(pr.PID); err != nil {
		t.Fatal(err)
	}
	observe := func() map[string]model.FDSite {
		t.Helper()
		if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
			t.Fatal(err)
		}
		out := map[string]model.FDSite{}
		for _, s := range pr.FD.PastSites {
			for _, f := range s.Stack {
				if strings.HasPrefix(f.Function, "site_") {
					out[f.Function] = s
				}
			}
		}
		return out
	}
	lost := func() uint64 {
		t.Helper()
		l, err := c.Lost()
		if err != nil {
			t.Fatal(err)
		}
		return l["fd_sites"]
	}
	counted := func(sites map[string]model.FDSite, names ...string) {
		t.Helper()
		for _, n := range names {
			if s, ok := sites[n]; !ok || s.OpenedTotal != 1 || s.ClosedTotal != 1 {
				t.Errorf("%s: %+v, want 1 opened and closed (sites: %v)", n, s, sites)
			}
		}
	}

	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	sites := observe()
	counted(sites, "site_0", "site_1", "site_2", "site_3")
	// site_4 and site_5: each open and each close lost.
	if _, ok := sites["site_4"]; ok || len(sites) != 4 || lost() != 4 {
		t.Fatalf("over the cap of 4: sites %v, %d lost; want site_0-3 and 4 lost", sites, lost())
	}
	observe()
	if c.Tracker.sites.Swept() == 0 {
		t.Skip("this kernel has no lookup-and-delete on hash maps: idle sites stay")
	}
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	sites = observe()
	counted(sites, "site_0", "site_1", "site_2", "site_3", "site_6", "site_7", "site_8", "site_9")
	if n := lost(); n != 4 {
		t.Errorf("%d lost after the idle sites were taken away, want still 4", n)
	}
}
