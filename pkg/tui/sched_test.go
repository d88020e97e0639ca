package tui

import (
	"bytes"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func TestSwitchRate(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, true)
	p := proc(100, "schedwork", 10, false)
	p.Sched.Voluntary, p.Sched.Involuntary = 1000, 200
	v.Update(snap(1, []*model.Process{p}, nil, nil))
	if !strings.Contains(buf.String(), "CS/S") {
		t.Fatalf("no CS/S column:\n%s", buf.String())
	}
	q := *p
	q.Sched.Voluntary, q.Sched.Involuntary = 61000, 10200 // +70000 in 2 s
	buf.Reset()
	v.Update(snap(3, []*model.Process{&q}, nil, nil))
	if !strings.Contains(buf.String(), " 35000 ") {
		t.Errorf("block lacks 35000 switches/s:\n%s", buf.String())
	}
}
