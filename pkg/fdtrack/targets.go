package fdtrack

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// targetsShown is how many groups of leaked fds a finding names.
const targetsShown = 3

// Target is a group of leaked fds that point at the same kind of thing, as
// lsof would show them: files of one directory and extension
// ("/var/cache/tok/*.json"), one file, sockets, pipes, eventfds, ...
type Target struct {
	What string
	FDs  int
}

// groupTargets groups fd link targets (the links of /proc/PID/fd), most fds
// first; a directory with several files of one extension becomes dir/*.ext.
func groupTargets(links []string) []Target {
	type fileGroup struct{ dir, ext string }
	files := map[fileGroup][]string{}
	counts := map[string]int{}
	for _, l := range links {
		switch {
		case strings.HasPrefix(l, "/"):
			g := fileGroup{path.Dir(l), path.Ext(l)}
			files[g] = append(files[g], l)
		case strings.HasPrefix(l, "socket:"):
			counts["socket"]++
		case strings.HasPrefix(l, "pipe:"):
			counts["pipe"]++
		case strings.HasPrefix(l, "anon_inode:"):
			kind := strings.Trim(strings.TrimPrefix(l, "anon_inode:"), "[]")
			counts[kind]++
		default:
			counts[l]++
		}
	}
	for g, paths := range files {
		slices.Sort(paths)
		if slices.Equal(paths, slices.Repeat(paths[:1], len(paths))) {
			counts[paths[0]] += len(paths) // one file, opened again and again
		} else {
			counts[path.Join(g.dir, "*"+g.ext)] += len(paths)
		}
	}
	out := make([]Target, 0, len(counts))
	for what, n := range counts {
		out = append(out, Target{What: what, FDs: n})
	}
	slices.SortFunc(out, func(a, b Target) int {
		return cmp.Or(cmp.Compare(b.FDs, a.FDs), cmp.Compare(a.What, b.What))
	})
	return out[:min(len(out), targetsShown)]
}

// leakedTargets names what the fds of f's opening site point at, read from
// /proc when the finding is made and again whenever the site has doubled
// since (the counts then say how many at that time), not every interval: a
// leak can hold thousands of links.
func (c *Concern) leakedTargets(p *model.Process, f *model.Finding) {
	if f.Kind != model.KindFDLeak || len(f.Stack) == 0 {
		return
	}
	i := slices.IndexFunc(p.FD.Sites, func(s model.FDSite) bool { return slices.Equal(s.Stack, f.Stack) })
	key := findingKey{p.PID, f.FirstSeen.UnixNano()}
	cached, ok := c.targets[key]
	if i >= 0 && (!ok || len(p.FD.Sites[i].FDs) >= 2*max(cached.fds, 1)) {
		if fds, err := c.proc.FDs(p.PID); err == nil {
			leaked := map[int]bool{}
			for _, n := range p.FD.Sites[i].FDs {
				leaked[int(n)] = true
			}
			var links []string
			for _, fd := range fds {
				if leaked[fd.Num] {
					links = append(links, fd.Target)
				}
			}
			cached = leakRead{groupTargets(links), len(links)}
			c.targets[key] = cached
		}
	}
	targets := cached.targets
	if len(targets) == 0 {
		return
	}
	// Evidence holds plain maps, as every other detector's: a struct would
	// encode its keys in field order and read back sorted.
	list := make([]map[string]any, len(targets))
	parts := make([]string, len(targets))
	for i, t := range targets {
		list[i] = map[string]any{"target": t.What, "fds": t.FDs}
		parts[i] = fmt.Sprintf("%s (%d)", t.What, t.FDs)
	}
	f.Evidence["leaked_targets"] = list
	f.Summary += "; leaking " + strings.Join(parts, ", ")
}

// leakRead is what an fd leak's fds pointed at when last read, and how many
// fds there were then.
type leakRead struct {
	targets []Target
	fds     int
}

// findingKey is one finding of a process, by its first sighting.
type findingKey struct {
	pid       int
	firstSeen int64
}
