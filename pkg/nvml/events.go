package nvml

import (
	"context"
	"log/slog"
	"maps"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Driver faults and changes of state reach the sampler as NVML events: an
// event set with every event type of eventTypes that each GPU reports,
// waited on by a goroutine of its own. Every event is counted by device
// and kind (EventCounts), an XID also by its number (XIDCounts); a fault
// is kept for the window it came in (Events) and handed to the detectors
// with the processes on its device. Events are registered on the GPUs,
// MIG mode or not: those that concern one MIG instance name its GPU and
// compute instances.

// eventWait is how long one wait for an event lasts: the goroutine notices
// the end of the run within it.
const eventWait = 500 * time.Millisecond

// maxWindowEvents bounds the events kept for one window: a device in
// trouble can report thousands a second; the counts keep every one.
const maxWindowEvents = 256

// eventTypes are the NVML event types watched, and the kind of
// model.GPUEvent each makes. fault: kept for the window and handed to the
// detectors (detect/gpuxid makes findings of them). The others are only
// counted: corrected errors and state changes say how a GPU fares, not
// that a job failed, and pstate and clock changes come by the dozen as a
// GPU goes busy and idle; kept, they would crowd the faults out of the
// bounded window.
var eventTypes = []struct {
	mask  uint64
	kind  string
	fault bool
}{
	{gonvml.EventTypeXidCriticalError, model.GPUEventXID, true},
	{gonvml.EventTypeDoubleBitEccError, model.GPUEventDoubleBitECC, true},
	{gonvml.EventTypeSingleBitEccError, model.GPUEventSingleBitECC, false},
	{gonvml.EventTypeSingleBitEccErrorStorm, model.GPUEventSingleBitECCStorm, false},
	{gonvml.EventTypeDramRetirementEvent, model.GPUEventDRAMRetirement, false},
	{gonvml.EventTypeDramRetirementFailure, model.GPUEventDRAMRetirementFailure, false},
	{gonvml.EventTypeNonFatalPoisonError, model.GPUEventNonFatalPoison, false},
	{gonvml.EventTypeFatalPoisonError, model.GPUEventFatalPoison, false},
	{gonvml.EventTypeGpuUnavailableError, model.GPUEventUnavailable, false},
	{gonvml.EventTypeGpuRecoveryAction, model.GPUEventRecoveryAction, false},
	{gonvml.EventTypePState, model.GPUEventPState, false},
	{gonvml.EventTypeClock, model.GPUEventClock, false},
	{gonvml.EventTypePowerSourceChange, model.GPUEventPowerSourceChange, false},
	{gonvml.EventMigConfigChange, model.GPUEventMIGConfigChange, false},
}

// watchedEvents is the mask of every type in eventTypes.
var watchedEvents = func() uint64 {
	var m uint64
	for _, t := range eventTypes {
		m |= t.mask
	}
	return m
}()

// watchEvents registers, on each GPU, the watched event types it reports
// and waits on them until ctx is done.
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
		if types &= watchedEvents; ret != gonvml.SUCCESS || types == 0 {
			continue
		}
		ret = dev.RegisterEvents(types, set)
		if xid := types & gonvml.EventTypeXidCriticalError; ret != gonvml.SUCCESS && xid != 0 && xid != types {
			// A type the device claims but fails to register must not
			// cost the XIDs: those alone, as before the other types.
			slog.Debug("NVML events", "device", i, "types", types, "err", ret.Error())
			types, ret = xid, dev.RegisterEvents(xid, set)
		}
		if ret != gonvml.SUCCESS {
			slog.Debug("NVML events", "device", i, "types", types, "err", ret.Error())
			continue
		}
		index[dev] = i
	}
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
			i, ok := index[data.Device]
			if !ok {
				continue
			}
			for _, t := range eventTypes {
				if data.EventType&t.mask == 0 {
					continue
				}
				uuid, _ := data.Device.GetUUID()
				e := model.GPUEvent{Time: time.Now(), Device: i, UUID: uuid, Kind: t.kind,
					GPUInstance: data.GpuInstanceId, ComputeInstance: data.ComputeInstanceId}
				if t.kind == model.GPUEventXID {
					e.XID = data.EventData
				}
				s.record(e, t.fault)
				break // one type an event
			}
		}
	}()
}

// record counts e and keeps it for the window if it is a fault.
func (s *Sampler) record(e model.GPUEvent, fault bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eventCounts[model.GPUEventKey{Device: e.Device, UUID: e.UUID, Kind: e.Kind}]++
	if e.Kind == model.GPUEventXID {
		s.xidCounts[model.XIDKey{Device: e.Device, UUID: e.UUID, XID: e.XID}]++
	}
	if fault && len(s.winEvents) < maxWindowEvents {
		s.winEvents = append(s.winEvents, e)
	}
}

// EventCounts returns how many events of each kind each device reported
// since Start (monotonic), XIDs among them.
func (s *Sampler) EventCounts() map[model.GPUEventKey]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.eventCounts)
}

// XIDCounts returns how many of each XID each device reported since
// Start (monotonic).
func (s *Sampler) XIDCounts() map[model.XIDKey]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.xidCounts)
}

// Events returns the faults of the window closed by the last Roll (at
// most maxWindowEvents of them), oldest first.
func (s *Sampler) Events() []model.GPUEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]model.GPUEvent(nil), s.rolledEvents...)
}
