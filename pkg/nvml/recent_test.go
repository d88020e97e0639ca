package nvml

import (
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// At hands out the sample of an instant: the newest taken at or before
// it, else the first after; DeviceFull says whether a device the process
// was on was full in that sample.
func TestAt(t *testing.T) {
	failed := New(&mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }})
	if err := failed.Start(t.Context(), time.Second); err == nil {
		t.Fatal("Start succeeded")
	}
	if x, ok := failed.At(time.Now()); ok || failed.DeviceFull(100, time.Now()) {
		t.Errorf("without NVML: At = %+v, %v; DeviceFull true", x, ok)
	}

	lib, fakes := twoGPUs()
	s := New(lib)
	// GPU 0 (pids 100 and 200): 10 GiB used, then 77 of its 80 (over
	// 95 %), then 20.
	for _, used := range []uint64{10, 77, 20} {
		fakes[0].setUsed(used * gib)
		if err := s.sample(); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.recent) != 3 {
		t.Fatalf("%d samples kept, want 3", len(s.recent))
	}
	t1, t2, t3 := s.recent[0].Time, s.recent[1].Time, s.recent[2].Time
	for _, c := range []struct {
		name string
		at   time.Time
		want time.Time
		used uint64
	}{
		{"before the first", t1.Add(-time.Hour), t1, 10},
		{"at the first", t1, t1, 10},
		{"between the first and the second", t1.Add(t2.Sub(t1) / 2), t1, 10},
		{"at the second", t2, t2, 77},
		{"after the last", t3.Add(time.Hour), t3, 20},
	} {
		x, ok := s.At(c.at)
		if !ok || !x.Time.Equal(c.want) || len(x.GPUs) != 2 || x.GPUs[0].MemoryUsed != c.used*gib {
			t.Errorf("%s: At = %v at %v, want the sample at %v with %d GiB used on GPU 0", c.name, ok, x.Time, c.want, c.used)
		}
	}
	// What At hands out is the caller's.
	x, _ := s.At(t2)
	x.GPUs[0].Processes[200] = 0
	if y, _ := s.At(t2); y.GPUs[0].Processes[200] != 1*gib || y.GPUs[0].Processes[100] != 4*gib {
		t.Errorf("At shares its maps: GPU 0 processes %v", y.GPUs[0].Processes)
	}

	for _, c := range []struct {
		pid  int
		at   time.Time
		want bool
	}{
		{200, t2, true},  // on GPU 0, 77 of 80 GiB
		{100, t2, true},  // on both GPUs: GPU 0 is full
		{200, t1, false}, // 10 GiB
		{200, t3, false},
		{300, t2, false}, // on GPU 1 without a memory figure, and GPU 1 is not full
		{400, t2, false}, // on no GPU
	} {
		if got := s.DeviceFull(c.pid, c.at); got != c.want {
			t.Errorf("DeviceFull(%d, sample %v) = %v, want %v", c.pid, c.at, got, c.want)
		}
	}
}

// The samples kept reach back to the Roll before last, at most
// recentSamples, the oldest and the newest among them.
func TestRecentBounded(t *testing.T) {
	lib, _ := twoGPUs()
	s := New(lib)
	sample := func(n int) {
		t.Helper()
		for range n {
			if err := s.sample(); err != nil {
				t.Fatal(err)
			}
		}
	}
	sample(3)
	s.Roll()
	before := s.recent[len(s.recent)-1].Time // the sample the first Roll's window ended with
	sample(2)
	first := s.recent[len(s.recent)-2].Time // the first sample after the first Roll
	s.Roll()
	sample(1)
	if len(s.recent) != 3 || !s.recent[0].Time.Equal(first) {
		t.Errorf("after two Rolls: %d samples from %v, want 3 from %v, the first after the Roll before last", len(s.recent), s.recent[0].Time, first)
	}
	if x, ok := s.At(before); !ok || !x.Time.Equal(first) {
		t.Errorf("At(a sample dropped) = %v, %v; want the oldest kept, %v", x.Time, ok, first)
	}

	sample(10 * recentSamples)
	newest := s.recent[len(s.recent)-1].Time
	if len(s.recent) != recentSamples || !s.recent[0].Time.Equal(first) {
		t.Fatalf("%d samples kept from %v, want %d from %v", len(s.recent), s.recent[0].Time, recentSamples, first)
	}
	// Spread over the span: none of the newest samples crowds the
	// others out.
	if mid, span := s.recent[recentSamples/2].Time.Sub(first), newest.Sub(first); mid < span/4 || mid > span*3/4 {
		t.Errorf("the middle sample kept is %v after the first, of %v: the kept samples are not spread", mid, span)
	}
	for i := 1; i < len(s.recent); i++ {
		if !s.recent[i-1].Time.Before(s.recent[i].Time) {
			t.Fatalf("samples out of order at %d", i)
		}
	}
}
