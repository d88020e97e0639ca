package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func ncclProc(pid, rank int, calls uint64, last time.Time) *model.Process {
	p := inPod(proc(pid, "python", 10, 1, 0, false), "ml", "train-0", "trainer")
	p.NCCL = model.NCCLStats{Library: "/usr/lib/libnccl.so.2", Comms: []model.NCCLComm{
		{ID: "00c0ffee00c0ffee", Rank: rank, NRanks: 2, Calls: map[string]uint64{"allreduce": calls, "broadcast": 1},
			Bytes: map[string]uint64{"allreduce": calls << 20, "broadcast": 8000}, LastTime: last, LastOp: "allreduce"},
		// Set up before tracking began: no id to name it by, no series.
		{Rank: -1, NRanks: -1, Calls: map[string]uint64{"send": 5}, LastTime: last, LastOp: "send"},
	}}
	return p
}

// In container granularity the ranks of one container are not summed, nor
// left out while uninteresting: the cross-node rule compares them one by
// one. They keep the process and pod labels of per-process series.
func TestNCCLSeriesPerRank(t *testing.T) {
	m, reg := containerMetrics(t)
	last := time.Unix(1700000000, 500000000)
	m.Update(snap(1, []*model.Process{ncclProc(100, 0, 40, last), ncclProc(101, 1, 38, last.Add(-time.Minute))}, nil, nil))
	want := `
# HELP autoglm_nccl_collectives_total NCCL collective and point-to-point calls of this rank of the communicator since attach, by operation; communicator is a hash of its ncclUniqueId, the same in every rank on every node (rank and nranks -1: a communicator from ncclCommSplit).
# TYPE autoglm_nccl_collectives_total counter
autoglm_nccl_collectives_total{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",op="allreduce",pid="100",pod="train-0",rank="0"} 40
autoglm_nccl_collectives_total{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",op="allreduce",pid="101",pod="train-0",rank="1"} 38
autoglm_nccl_collectives_total{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",op="broadcast",pid="100",pod="train-0",rank="0"} 1
autoglm_nccl_collectives_total{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",op="broadcast",pid="101",pod="train-0",rank="1"} 1
# HELP autoglm_nccl_last_collective_timestamp_seconds When this rank of the communicator last entered an NCCL collective or point-to-point call (Unix time); labels as for autoglm_nccl_collectives_total.
# TYPE autoglm_nccl_last_collective_timestamp_seconds gauge
autoglm_nccl_last_collective_timestamp_seconds{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",pid="100",pod="train-0",rank="0"} 1.7000000005e+09
autoglm_nccl_last_collective_timestamp_seconds{comm="python",communicator="00c0ffee00c0ffee",container="trainer",namespace="ml",nranks="2",pid="101",pod="train-0",rank="1"} 1.6999999405e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_nccl_collectives_total", "autoglm_nccl_last_collective_timestamp_seconds",
		"autoglm_container_nccl_collectives_total", "autoglm_container_nccl_last_collective_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	// A rank gone: its series go with it, and no container sum keeps them.
	m.Update(snap(2, []*model.Process{ncclProc(100, 0, 41, last)}, nil, nil))
	if n := testutil.CollectAndCount(collector{m}, "autoglm_nccl_collectives_total"); n != 2 {
		t.Errorf("%d collective series after rank 1 went, want 2", n)
	}
	problems, err := testutil.CollectAndLint(collector{m}, "autoglm_nccl_collectives_total", "autoglm_nccl_last_collective_timestamp_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
