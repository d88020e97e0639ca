package symbolize

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// execLines are the executable lines of pid's maps: start, end, offset and
// path, once its loader has mapped libc.
func execLines(t *testing.T, pid int) [][4]string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
		if err != nil {
			t.Fatal(err)
		}
		var out [][4]string
		libc := false
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 || !strings.Contains(f[1], "x") {
				continue
			}
			start, end, _ := strings.Cut(f[0], "-")
			path := ""
			if len(f) > 5 {
				path = f[5]
			}
			libc = libc || strings.HasSuffix(path, "/libc.so.6")
			out = append(out, [4]string{start, end, f[2], path})
		}
		if libc {
			return out
		}
	}
	t.Fatalf("pid %d did not map libc", pid)
	return nil
}

// The code mappings of two processes of one binary are their executable
// lines of /proc/PID/maps, in order; each file's id is the same in both
// (and not 0), whatever its address, and turns an address into its file
// offset; a pseudo mapping ([vdso]) is the process's own code (0). Read
// through a poll's reader too (ShareMaps), the same.
func TestCodeMappings(t *testing.T) {
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uint64{}
	for i, s := range []*Symbolizer{New("/proc"), New("/proc").ShareMaps(fs.WithPollCache(procinfo.NewPollCache()))} {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		lines := execLines(t, c.Process.Pid)
		ms, err := s.CodeMappings(c.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != len(lines) {
			t.Fatalf("process %d: %d code mappings %+v, maps has %d executable lines %v", i, len(ms), ms, len(lines), lines)
		}
		for j, m := range ms {
			l := lines[j]
			start, _ := strconv.ParseUint(l[0], 16, 64)
			end, _ := strconv.ParseUint(l[1], 16, 64)
			off, _ := strconv.ParseUint(l[2], 16, 64)
			if m.Start != start || m.End != end {
				t.Errorf("process %d: mapping %d is %#x-%#x, maps has %v", i, j, m.Start, m.End, l)
			}
			if !strings.HasPrefix(l[3], "/") {
				if m.File != 0 || m.Bias != 0 {
					t.Errorf("process %d: %s has file %#x, bias %#x: want the process's own", i, l[3], m.File, m.Bias)
				}
				continue
			}
			if m.File == 0 || m.File&(1<<63) != 0 || m.Bias != start-off {
				t.Errorf("process %d: %s has file %#x, bias %#x (start %#x, offset %#x)", i, l[3], m.File, m.Bias, start, off)
			}
			if id, ok := ids[l[3]]; ok && id != m.File {
				t.Errorf("%s has ids %#x and %#x in two processes", l[3], id, m.File)
			}
			ids[l[3]] = m.File
		}
	}
}

// A file's code id is its build id's where it has one (copies, stripped
// or not, of one size meet), else the file's; never 0, bit 63 clear.
func TestCodeID(t *testing.T) {
	a := codeID(buildKey{id: "\x01\x02", size: 100}, fileKey{dev: 1, inode: 2})
	if b := codeID(buildKey{id: "\x01\x02", size: 100}, fileKey{dev: 3, inode: 4}); b != a {
		t.Errorf("one build id through two files: %#x and %#x", a, b)
	}
	if b := codeID(buildKey{id: "\x01\x02", size: 101}, fileKey{dev: 1, inode: 2}); b == a {
		t.Error("one build id at two sizes: one id")
	}
	f := codeID(buildKey{}, fileKey{dev: 1, inode: 2})
	if g := codeID(buildKey{}, fileKey{dev: 1, inode: 3}); g == f {
		t.Error("two files without build id: one id")
	}
	for _, id := range []uint64{a, f} {
		if id == 0 || id&(1<<63) != 0 {
			t.Errorf("id %#x", id)
		}
	}
}
