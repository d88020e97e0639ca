package model

import (
	"testing"
	"time"
)

// The snapshot that says a process exited does not replace its last one
// alive; a later process with the same pid is another.
func TestLastAlive(t *testing.T) {
	t0 := time.Unix(1000, 0)
	alive := &Process{PID: 7, Started: t0, FD: FDStats{Open: 40}}
	gone := &Process{PID: 7, Started: t0, Exited: true}
	reused := &Process{PID: 7, Started: t0.Add(time.Minute), FD: FDStats{Open: 3}}
	var l LastAlive
	l.Update(&Snapshot{Processes: []*Process{{PID: 7, Started: t0}}})
	l.Update(&Snapshot{Processes: []*Process{alive}})
	l.Update(&Snapshot{Processes: []*Process{gone}})
	l.Update(&Snapshot{Processes: []*Process{reused}})
	if got := l.Of(7, t0); got != alive {
		t.Errorf("first process: %+v, want its last snapshot alive", got)
	}
	if got := l.Of(7, reused.Started); got != reused {
		t.Errorf("reused pid: %+v", got)
	}
	if all := l.All(); len(all) != 2 || all[0] != alive || all[1] != reused {
		t.Errorf("all: %v", all)
	}
	// A process seen only exited is kept as that.
	l.Update(&Snapshot{Processes: []*Process{{PID: 9, Started: t0, Exited: true}}})
	if got := l.Of(9, t0); got == nil || !got.Exited {
		t.Errorf("a process seen only exited: %+v", got)
	}
}
