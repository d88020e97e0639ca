package symbolize

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// A .zdebug_ section is small in the file but names the size it
// decompresses to: a crafted one (64 MiB of zeros in 64 KiB) is refused
// and counted, not read.
func TestLinesCompressedBomb(t *testing.T) {
	bin := buildTarget(t, "target", "-g", "-fPIE", "-pie")
	const claimed = 64 << 20
	var z bytes.Buffer
	z.WriteString("ZLIB")
	_ = binary.Write(&z, binary.BigEndian, uint64(claimed))
	w, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	zeros := make([]byte, 1<<20)
	for range claimed / len(zeros) {
		w.Write(zeros)
	}
	w.Close()
	blob := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(blob, z.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	bomb := filepath.Join(t.TempDir(), "bomb")
	if out, err := exec.Command(lookTool(t, "objcopy"), "--add-section", ".zdebug_abbrev="+blob, bin, bomb).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	pid, addr := startTarget(t, bomb)
	s := New("/proc")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f := s.Frames(pid, []uint64{addr + 4})[0]
	runtime.ReadMemStats(&after)
	if f.Function != "leakyfn" || f.Line != 0 {
		t.Errorf("frame %+v, want leakyfn without a line", f)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > claimed/4 {
		t.Errorf("symbolizing allocated %d bytes: the compressed section was read", got)
	}
	if s.Refused() != 1 {
		t.Errorf("Refused() = %d, want 1", s.Refused())
	}
}
