package nvml

import (
	"context"
	"log/slog"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Driver faults reach the sampler as NVML events: an event set with the
// XID critical errors of every device that reports them, waited on by a
// goroutine of its own. Each event is kept for the window it came in
// (Events) and counted by device and XID (XIDCounts).

// eventWait is how long one wait for an event lasts: the goroutine notices
// the end of the run within it.
const eventWait = 500 * time.Millisecond

// maxWindowEvents bounds the events kept for one window: a device in
// trouble can report thousands a second; the counts keep every one.
const maxWindowEvents = 256

// watchEvents registers the devices' XID events and waits on them until
// ctx is done. It reports which devices deliver them.
func (s *Sampler) watchEvents(ctx context.Context) {
	set, ret := s.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		slog.Debug("NVML events unavailable", "err", ret.Error())
		return
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		_ = set.Free()
		return
	}
	index := map[gonvml.Device]int{}
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			continue
		}
		types, ret := dev.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS || types&gonvml.EventTypeXidCriticalError == 0 {
			continue
		}
		if ret := dev.RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			slog.Debug("NVML XID events", "device", i, "err", ret.Error())
			continue
		}
		index[dev] = i
	}
	s.mu.Lock()
	for _, i := range index {
		s.xidDevices[i] = true
	}
	s.mu.Unlock()
	if len(index) == 0 {
		_ = set.Free()
		return
	}
	s.events.Add(1)
	go func() {
		defer s.events.Done()
		defer set.Free()
		for ctx.Err() == nil {
			data, ret := set.Wait(uint32(eventWait / time.Millisecond))
			switch ret {
			case gonvml.SUCCESS:
			case gonvml.ERROR_TIMEOUT:
				continue
			default:
				// A GPU lost (XID 79) can make waits fail at once:
				// do not spin.
				slog.Debug("NVML event wait", "err", ret.Error())
				select {
				case <-ctx.Done():
				case <-time.After(eventWait):
				}
				continue
			}
			if data.EventType&gonvml.EventTypeXidCriticalError == 0 {
				continue
			}
			i, ok := index[data.Device]
			if !ok {
				continue
			}
			uuid, _ := data.Device.GetUUID()
			s.recordXID(model.GPUEvent{Time: time.Now(), Device: i, UUID: uuid, XID: data.EventData,
				GPUInstance: data.GpuInstanceId, ComputeInstance: data.ComputeInstanceId})
		}
	}()
}

func (s *Sampler) recordXID(e model.GPUEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.xidCounts[model.XIDKey{Device: e.Device, UUID: e.UUID, XID: e.XID}]++
	if len(s.winEvents) < maxWindowEvents {
		s.winEvents = append(s.winEvents, e)
	}
}

// XIDCounts returns how many of each XID each device reported since
// Start (monotonic).
func (s *Sampler) XIDCounts() map[model.XIDKey]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[model.XIDKey]uint64, len(s.xidCounts))
	for k, n := range s.xidCounts {
		out[k] = n
	}
	return out
}

// Events returns the XID errors of the window closed by the last Roll
// (at most maxWindowEvents of them), oldest first.
func (s *Sampler) Events() []model.GPUEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]model.GPUEvent(nil), s.rolledEvents...)
}

// XIDDevices reports, by device index, the devices whose XID errors are
// watched.
func (s *Sampler) XIDDevices() map[int]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]bool, len(s.xidDevices))
	for i := range s.xidDevices {
		out[i] = true
	}
	return out
}
