package nccltrack

// Op is one hooked NCCL function.
type Op struct {
	Func string // the exported name in libnccl.so.2
	// Name is the operation as the model and metrics name it; "" for
	// set-up and tear-down, which are not counted.
	Name string
	// Setup: hooked at return too (the communicator's handle is written
	// by then).
	Setup bool
}

// Ops follows enum nccl_op in bpf/nccl.bpf.c: the index is the cookie.
// ncclGroupStart and ncclGroupEnd are not hooked: they name no
// communicator, and the calls between them are counted one by one.
var Ops = []Op{
	{Func: "ncclAllReduce", Name: "allreduce"},
	{Func: "ncclAllGather", Name: "allgather"},
	{Func: "ncclReduceScatter", Name: "reducescatter"},
	{Func: "ncclBroadcast", Name: "broadcast"},
	{Func: "ncclBcast", Name: "broadcast"}, // NCCL 1's in-place form: the same operation
	{Func: "ncclReduce", Name: "reduce"},
	{Func: "ncclSend", Name: "send"},
	{Func: "ncclRecv", Name: "recv"},
	{Func: "ncclCommInitRank", Setup: true},
	{Func: "ncclCommInitRankConfig", Setup: true},
	{Func: "ncclCommInitAll", Setup: true},
	{Func: "ncclCommSplit", Setup: true},
	{Func: "ncclCommDestroy"},
	{Func: "ncclCommAbort"},
}

// counted is the number of counted operations, the first of Ops.
const counted = int(ncclNcclOpNCCL_OP_COUNTED)
