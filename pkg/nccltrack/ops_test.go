package nccltrack

import "testing"

// The Go table follows enum nccl_op: an index is the cookie the BPF side
// reads, and the object has an entry program for each function.
func TestOpsFollowTheObject(t *testing.T) {
	if len(Ops) != int(ncclNcclOpNCCL_OP_MAX) {
		t.Fatalf("%d ops, enum nccl_op has %d", len(Ops), ncclNcclOpNCCL_OP_MAX)
	}
	for i, op := range Ops {
		if (op.Name != "") != (i < counted) {
			t.Errorf("%s: counted %v, index %d of %d counted", op.Func, op.Name != "", i, counted)
		}
	}
	if Ops[ncclNcclOpNCCL_OP_REDUCE].Func != "ncclReduce" || Ops[ncclNcclOpNCCL_OP_SPLIT].Func != "ncclCommSplit" || Ops[ncclNcclOpNCCL_OP_ABORT].Func != "ncclCommAbort" {
		t.Error("Ops is out of the enum's order")
	}
	spec, err := loadNccl()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range Ops {
		if spec.Programs["enter_"+op.Func] == nil {
			t.Errorf("the object has no enter_%s", op.Func)
		}
	}
}
