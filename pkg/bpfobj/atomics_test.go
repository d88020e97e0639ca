package bpfobj_test

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// Kernels before 5.12 refuse every atomic operation but a plain add whose
// result is unused ("BPF_STX uses reserved fields"), in dead code too:
// no committed object may hold another (clang writes an atomic or for an
// add of a constant 0, a fetch-add where the result is used).
func TestOnlyPlainAtomicAdds(t *testing.T) {
	objs, err := filepath.Glob(filepath.Join(testutil.RepoRoot(), "pkg", "*", "*_bpfel.o"))
	if err != nil || len(objs) < 5 {
		t.Fatalf("BPF objects %v: %v", objs, err)
	}
	for _, o := range objs {
		spec, err := ebpf.LoadCollectionSpec(o)
		if err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		for name, p := range spec.Programs {
			for _, ins := range p.Instructions {
				if ins.OpCode.Class() == asm.StXClass && ins.OpCode.Mode() == asm.AtomicMode && ins.OpCode.AtomicOp() != asm.AddAtomic {
					t.Errorf("%s: program %s: %v: only plain atomic adds load before Linux 5.12", filepath.Base(o), name, ins)
				}
			}
		}
	}
}
