package procinfo

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// parseStat takes any bytes without panicking; and a line the kernel's
// format makes of any command name (spaces, parentheses and all) and any
// layout reads back with that name and layout.
//
//	go test -run '^$' -fuzz FuzzParseStat ./pkg/procinfo
func FuzzParseStat(f *testing.F) {
	f.Add([]byte(fmt.Sprintf(statFmt, 42, "python3", "S", 7, 0)), "python3", uint64(140727842612960), uint64(93922343264256))
	f.Add([]byte("42 (x) S 1 2"), "a) (b c", uint64(0), uint64(1))
	f.Add([]byte("1 ()"), ")", uint64(1<<63), uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, comm string, stack, brk uint64) {
		_, _ = parseStat(raw)

		fields := strings.Fields(fmt.Sprintf(statFmt, 42, "x", "S", 7, 0))[2:] // from state on: field 3
		fields[28-3] = strconv.FormatUint(stack, 10)
		fields[47-3] = strconv.FormatUint(brk, 10)
		line := "42 (" + comm + ") " + strings.Join(fields, " ") + "\n"
		st, err := parseStat([]byte(line))
		if err != nil {
			t.Fatalf("parseStat(%q): %v", line, err)
		}
		if st.Comm != comm || st.StartStack != stack || st.StartBrk != brk || st.PPID != 7 || st.Starttime != 18083 {
			t.Fatalf("parseStat(%q) = %+v", line, st)
		}
	})
}
