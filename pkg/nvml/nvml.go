// Package nvml samples the GPUs through NVIDIA's management library: memory
// used and total and utilization per device, and device memory used per
// process. That is the GPU's own figure, which the eBPF CUDA hooks cannot
// see whole (contexts, caching allocators, paths not hooked); Join puts the
// two side by side. On a GPU in MIG mode each MIG instance is a device of
// its own (model.GPU.MIG): processes run on instances, and NVML reports
// their memory per instance.
//
// NVML is optional: without the library or a loaded driver Start fails with
// a clear error and the rest of the tool works as before.
package nvml

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Sampling intervals: the default of --gpu-interval and the least accepted.
// NVML queries take tens of microseconds each; below 10ms the sampler would
// mostly measure itself.
const (
	DefaultInterval = 100 * time.Millisecond
	MinInterval     = 10 * time.Millisecond
)

// Sampler polls NVML in the background. Its figures are read by window:
// Roll ends one (the pipeline rolls at each poll) and what the samples
// since the previous Roll did, the least, the most and the last, is what
// GPUs and ProcessMemory report until the next. A value a few samples saw
// between two polls thus still shows in the window's Max.
type Sampler struct {
	lib gonvml.Interface

	mu    sync.Mutex
	gpus  []model.GPU    // the latest sample
	procs map[int]uint64 // device memory used by pid, summed over devices, in the latest sample
	// The open window: by pid, and device memory used by device.
	winProcs map[int]Range
	winGPUs  map[devKey]Range
	// The window closed by the last Roll.
	rolledGPUs  []model.GPU
	rolledProcs map[int]Range
	// Utilization per process and device: the readings of the open window
	// and the means of the closed one, by pid. lastSeen is, per device,
	// the newest per-process sample read (NVML's microsecond timestamp):
	// each reading asks for the samples since. Only the sampling goroutine
	// touches lastSeen.
	winUtil    map[utilKey]utilSum
	rolledUtil map[int][]model.GPUUtil
	lastSeen   map[devKey]uint64
	// NVML events (events.go): the faults of the open window and the
	// closed one; counts since Start of every event by kind and of the
	// XIDs by number.
	winEvents, rolledEvents []model.GPUEvent
	rolledUse               map[int]devUse // where each process ran in the closed window, while it has faults
	eventCounts             map[model.GPUEventKey]uint64
	xidCounts               map[model.XIDKey]uint64
	events                  sync.WaitGroup // the event goroutine
	// The latest samples whole, for At (recent.go), and the times of the
	// last two Rolls, which say how far back they go.
	recent []Sample
	rolled [2]time.Time

	done chan struct{} // closed once the loop has shut NVML down
}

// New returns a sampler over lib: gonvml.New() for the real library, a mock
// in tests, nil where no GPU can be reached (Start then fails with
// ErrNoDevices).
func New(lib gonvml.Interface) *Sampler {
	return &Sampler{lib: lib, procs: map[int]uint64{}, winProcs: map[int]Range{}, winGPUs: map[devKey]Range{}, rolledProcs: map[int]Range{},
		winUtil: map[utilKey]utilSum{}, rolledUtil: map[int][]model.GPUUtil{}, lastSeen: map[devKey]uint64{},
		eventCounts: map[model.GPUEventKey]uint64{}, xidCounts: map[model.XIDKey]uint64{},
		done: make(chan struct{})}
}

// Range is what one figure did within a window: the least and the most of
// its samples, and the last one.
type Range struct{ Min, Max, Last uint64 }

// with returns r extended by the sample v; the zero Range has no sample.
func (r Range) with(v uint64, first bool) Range {
	if first {
		return Range{v, v, v}
	}
	return Range{min(r.Min, v), max(r.Max, v), v}
}

// Start initializes NVML, takes a first sample, and samples every interval
// until ctx is done, then shuts NVML down (Wait waits for that). An error
// means no GPU metrics this run; the caller logs it once and goes on: the
// sampler then reports no GPU and no process.
func (s *Sampler) Start(ctx context.Context, every time.Duration) error {
	err := s.start(ctx, every)
	if err != nil {
		close(s.done)
	}
	return err
}

func (s *Sampler) start(ctx context.Context, every time.Duration) error {
	if every < MinInterval {
		return fmt.Errorf("GPU sampling interval %s is below the minimum %s", every, MinInterval)
	}
	if s.lib == nil {
		return fmt.Errorf("%w: %w, NVML not loaded; GPU metrics off", ErrUnavailable, ErrNoDevices)
	}
	if ret := s.lib.Init(); ret != gonvml.SUCCESS {
		return unavailable(ret)
	}
	if err := s.sample(); err != nil {
		s.shutdown()
		return err
	}
	s.Roll()
	s.watchEvents(ctx)
	go s.loop(ctx, every)
	return nil
}

// Wait blocks, after Start, until the sampling loop has ended (its ctx is
// done) and NVML is shut down; after a failed Start it returns at once.
func (s *Sampler) Wait() { <-s.done }

func (s *Sampler) loop(ctx context.Context, every time.Duration) {
	defer close(s.done)
	defer s.shutdown()
	defer s.events.Wait() // its event set freed before NVML is shut down
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := s.sample(); err != nil {
				// The last good sample stays; a GPU that fell off the
				// bus should not stop the run.
				slog.Debug("NVML sample", "err", err)
			}
		}
	}
}

func (s *Sampler) shutdown() {
	if ret := s.lib.Shutdown(); ret != gonvml.SUCCESS {
		slog.Debug("NVML shutdown", "err", ret.Error())
	}
}

// sample reads every device, and every MIG instance of a GPU in MIG mode,
// once and replaces the kept sample.
func (s *Sampler) sample() error {
	n, ret := s.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("NVML: counting devices: %s", ret.Error())
	}
	gpus := make([]model.GPU, 0, n)
	r := reading{procs: map[int]uint64{}, util: map[utilKey]utilReading{}, uuids: map[devKey]string{}}
	for i := range n {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			slog.Debug("NVML device handle", "index", i, "err", ret.Error())
			continue
		}
		migs, mig := migInstances(dev, i)
		// In MIG mode the parent's process lists add up its instances'
		// (and need privileges theirs do not): a process is read on
		// its instance alone, else it would count twice.
		gpus = append(gpus, s.read(dev, devKey{i, wholeGPU}, !mig, &r))
		for _, m := range migs {
			g := s.read(m.dev, devKey{i, m.index}, true, &r)
			g.GPUInstance = m.gpuInstance
			gpus = append(gpus, g)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus, s.procs = gpus, r.procs
	s.remember(Sample{Time: time.Now(), GPUs: gpus})
	for _, k := range r.listedOn {
		if _, ok := s.winUtil[k]; !ok {
			s.winUtil[k] = utilSum{uuid: r.uuids[k.dev]}
		}
	}
	for k, u := range r.util {
		sum := s.winUtil[k]
		sum.sm += u.sm
		sum.mem += u.mem
		sum.n++
		sum.uuid, sum.device = u.uuid, u.device
		s.winUtil[k] = sum
	}
	for pid, b := range r.procs {
		w, ok := s.winProcs[pid]
		s.winProcs[pid] = w.with(b, !ok)
	}
	for _, g := range gpus {
		k := keyOf(g.Index, g.MIG)
		w, ok := s.winGPUs[k]
		s.winGPUs[k] = w.with(g.MemoryUsed, !ok)
	}
	return nil
}

// reading is what one sample read of the processes on every device.
type reading struct {
	procs    map[int]uint64 // device memory by pid, summed over devices
	util     map[utilKey]utilReading
	listedOn []utilKey         // processes on devices with per-process samples
	uuids    map[devKey]string // of those devices
}

// read samples one device, a GPU or a MIG instance, and adds its
// processes to r unless processes is false. Failures of single queries
// leave that value zero: a MIG device does not report utilization, and
// that must not hide its memory.
func (s *Sampler) read(dev gonvml.Device, k devKey, processes bool, r *reading) model.GPU {
	g := model.GPU{Index: k.index, MIG: k.migIndex(), Processes: map[int]uint64{}}
	if uuid, ret := dev.GetUUID(); ret == gonvml.SUCCESS {
		g.UUID = uuid
	}
	if name, ret := dev.GetName(); ret == gonvml.SUCCESS {
		g.Name = name
	}
	if mem, ret := dev.GetMemoryInfo(); ret == gonvml.SUCCESS {
		g.MemoryUsed, g.MemoryTotal = mem.Used, mem.Total
	}
	u, uret := dev.GetUtilizationRates()
	if uret == gonvml.SUCCESS {
		g.Utilization, g.MemoryUtilization = float64(u.Gpu)/100, float64(u.Memory)/100
	}
	if !processes {
		return g
	}
	listed := map[int]bool{} // with or without a memory figure
	for _, list := range []func() ([]gonvml.ProcessInfo, gonvml.Return){dev.GetComputeRunningProcesses, dev.GetGraphicsRunningProcesses} {
		infos, ret := list()
		if ret != gonvml.SUCCESS {
			continue
		}
		for _, pi := range infos {
			listed[int(pi.Pid)] = true
			// Without permission (or under some virtualization) the
			// driver lists the process but not its memory.
			if pi.UsedGpuMemory == notAvailable {
				continue
			}
			// A process with both a compute and a graphics context is
			// listed twice with the same total: take it once.
			pid := int(pi.Pid)
			g.Processes[pid] = max(g.Processes[pid], pi.UsedGpuMemory)
		}
	}
	for pid, b := range g.Processes {
		r.procs[pid] += b
	}
	g.PerProcessUtil = s.readUtil(dev, k, g.UUID, listed, r.util)
	if g.PerProcessUtil {
		for pid := range listed {
			// Listed, so reported even if no reading comes this
			// window: 0.
			r.listedOn = append(r.listedOn, utilKey{pid, k})
		}
		r.uuids[k] = g.UUID
	} else if uret == gonvml.SUCCESS {
		// No samples of its own (MIG, some vGPU): each process on the
		// device gets the device's figure, said to be the device's.
		for pid := range listed {
			r.util[utilKey{pid, k}] = utilReading{g.Utilization, g.MemoryUtilization, g.UUID, true}
		}
	}
	return g
}

// migInstance is a MIG device of a GPU.
type migInstance struct {
	dev         gonvml.Device
	index       int    // its index on the GPU
	gpuInstance uint32 // its GPU instance id; model.NoInstance when not known
}

// migInstances returns the MIG devices of GPU i, dev, and whether it is in
// MIG mode. They are read at every sample: instances are made and
// destroyed (EventMigConfigChange) while the GPU runs.
func migInstances(dev gonvml.Device, i int) ([]migInstance, bool) {
	current, _, ret := dev.GetMigMode()
	if ret != gonvml.SUCCESS || current != gonvml.DEVICE_MIG_ENABLE {
		return nil, false // NOT_SUPPORTED on GPUs without MIG
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		slog.Debug("NVML MIG device count", "index", i, "err", ret.Error())
		return nil, true
	}
	var out []migInstance
	for j := range n {
		m, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret != gonvml.SUCCESS {
			continue // NOT_FOUND: no instance in that slot
		}
		gi := uint32(model.NoInstance)
		if id, ret := m.GetGpuInstanceId(); ret == gonvml.SUCCESS {
			gi = uint32(id)
		}
		out = append(out, migInstance{m, j, gi})
	}
	return out, true
}

// devKey is a device the sampler reads: the GPU of NVML index index, mig
// wholeGPU; or MIG device mig of it.
type devKey struct{ index, mig int }

// wholeGPU is the devKey.mig of a GPU, not a MIG instance.
const wholeGPU = -1

// keyOf is the devKey of a device as model.GPU and model.GPUUtil name it.
func keyOf(index int, mig *int) devKey {
	if mig == nil {
		return devKey{index, wholeGPU}
	}
	return devKey{index, *mig}
}

// migIndex is k's MIG index as model.GPU and model.GPUUtil hold it.
func (k devKey) migIndex() *int {
	if k.mig == wholeGPU {
		return nil
	}
	mig := k.mig
	return &mig
}

// Roll ends the current window: from now until the next Roll, GPUs and
// ProcessMemory report what the samples taken since the previous Roll did.
// The new window starts with the latest sample, which holds until the next
// one. A process or device missing from the latest sample is left out.
func (s *Sampler) Roll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gpus == nil {
		return // not started
	}
	s.rolled = [2]time.Time{s.rolled[1], time.Now()}
	s.rolledProcs = make(map[int]Range, len(s.procs))
	for pid, b := range s.procs {
		r := s.winProcs[pid]
		r.Last = b
		s.rolledProcs[pid] = r
	}
	s.rolledGPUs = make([]model.GPU, len(s.gpus))
	for i, g := range s.gpus {
		r := s.winGPUs[keyOf(g.Index, g.MIG)]
		g.MemoryUsedMin, g.MemoryUsedMax = r.Min, r.Max
		s.rolledGPUs[i] = g // the maps of a sample are never written again
	}
	clear(s.winProcs)
	for pid, b := range s.procs {
		s.winProcs[pid] = Range{b, b, b}
	}
	clear(s.winGPUs)
	for _, g := range s.gpus {
		s.winGPUs[keyOf(g.Index, g.MIG)] = Range{g.MemoryUsed, g.MemoryUsed, g.MemoryUsed}
	}
	s.rolledUtil = make(map[int][]model.GPUUtil, len(s.rolledUtil))
	for k, sum := range s.winUtil {
		src := model.UtilProcess
		if sum.device {
			src = model.UtilDevice
		}
		u := model.GPUUtil{Device: k.dev.index, MIG: k.dev.migIndex(), UUID: sum.uuid, Source: src}
		if sum.n > 0 {
			u.SM, u.Memory = sum.sm/float64(sum.n), sum.mem/float64(sum.n)
		}
		s.rolledUtil[k.pid] = append(s.rolledUtil[k.pid], u)
	}
	for _, us := range s.rolledUtil {
		slices.SortFunc(us, func(a, b model.GPUUtil) int {
			ka, kb := keyOf(a.Device, a.MIG), keyOf(b.Device, b.MIG)
			return cmp.Or(cmp.Compare(ka.index, kb.index), cmp.Compare(ka.mig, kb.mig))
		})
	}
	clear(s.winUtil)
	s.rolledEvents, s.winEvents = s.winEvents, nil
	// Where each process ran, for the window's faults: who each concerns.
	s.rolledUse = nil
	if len(s.rolledEvents) > 0 {
		s.rolledUse = s.uses()
		for i, e := range s.rolledEvents {
			var ps []model.DeviceProcess
			for _, pid := range slices.Sorted(maps.Keys(s.rolledUse)) {
				if s.rolledUse[pid].concerns(e) {
					ps = append(ps, model.DeviceProcess{PID: pid})
				}
			}
			s.rolledEvents[i].Processes = ps
		}
	}
}

// utilKey is a process on a device.
type utilKey struct {
	pid int
	dev devKey
}

// utilReading is one sample's utilization of a process on a device.
type utilReading struct {
	sm, mem float64
	uuid    string
	device  bool // the device's own figure (model.UtilDevice)
}

// utilSum adds up a window's readings (none yet: n is 0).
type utilSum struct {
	sm, mem float64
	n       int
	uuid    string
	device  bool
}

// readUtil reads the per-process utilization samples device k took since
// the last read into out and reports whether the device keeps such
// samples. The driver takes them at its own pace, slower than ours: a read
// with no new sample is no reading at all; one with new samples reads 0
// for each process listed on the device that has none (it ran no kernel).
func (s *Sampler) readUtil(dev gonvml.Device, k devKey, uuid string, listed map[int]bool, out map[utilKey]utilReading) bool {
	samples, ret := dev.GetProcessUtilization(s.lastSeen[k])
	if ret != gonvml.SUCCESS && ret != gonvml.ERROR_NOT_FOUND { // NOT_FOUND: no sample since
		return false
	}
	type acc struct {
		sm, mem uint64
		n       int
	}
	per := map[int]acc{}
	newest := s.lastSeen[k]
	for _, x := range samples {
		if x.TimeStamp <= s.lastSeen[k] {
			continue
		}
		newest = max(newest, x.TimeStamp)
		a := per[int(x.Pid)]
		a.sm += uint64(x.SmUtil)
		a.mem += uint64(x.MemUtil)
		a.n++
		per[int(x.Pid)] = a
	}
	s.lastSeen[k] = newest
	if len(per) == 0 {
		return true
	}
	for pid := range listed {
		out[utilKey{pid, k}] = utilReading{uuid: uuid}
	}
	for pid, a := range per {
		out[utilKey{pid, k}] = utilReading{sm: float64(a.sm) / float64(a.n) / 100, mem: float64(a.mem) / float64(a.n) / 100, uuid: uuid}
	}
	return true
}

// Utilization returns how busy pid kept each device, as of the last Roll:
// the means of the window's samples, by device index, then MIG instance.
func (s *Sampler) Utilization(pid int) []model.GPUUtil {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rolledUtil[pid])
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
const notAvailable = ^uint64(0)

// GPUs returns the devices as of the last Roll (MemoryUsed the last
// sample, MemoryUsedMin and MemoryUsedMax over the window); nil before Start
// succeeds.
func (s *Sampler) GPUs() []model.GPU {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rolledGPUs == nil {
		return nil
	}
	out := make([]model.GPU, len(s.rolledGPUs))
	for i, g := range s.rolledGPUs {
		g.Processes = maps.Clone(g.Processes)
		out[i] = g
	}
	return out
}

// ProcessMemory returns the device memory pid uses on all its devices
// (GPUs, MIG instances) together as of the last Roll, and whether NVML
// listed it then.
func (s *Sampler) ProcessMemory(pid int) (Range, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rolledProcs[pid]
	return r, ok
}

// Join records NVML's figures for p (from ProcessMemory) next to what the
// CUDA hooks saw; p.CUDA.LiveBytes must be filled first. The difference
// from the last sample is memory the hooks do not account for: contexts,
// module images, allocator caches, allocation paths not hooked.
func Join(p *model.Process, used Range, ok bool) {
	if !ok {
		p.CUDA.NVMLUsedBytes, p.CUDA.NVMLMinBytes, p.CUDA.NVMLMaxBytes, p.CUDA.HasNVML, p.CUDA.UntrackedBytes = 0, 0, 0, false, 0
		return
	}
	p.CUDA.NVMLUsedBytes, p.CUDA.NVMLMinBytes, p.CUDA.NVMLMaxBytes, p.CUDA.HasNVML = used.Last, used.Min, used.Max, true
	p.CUDA.UntrackedBytes = int64(used.Last) - int64(p.CUDA.LiveBytes)
}

// Enrich joins NVML's figures of the last interval into p: its memory
// (Join), so that findings can show untracked bytes, its utilization, and
// the driver faults of the devices it uses. It runs whatever views are up
// (p.CUDA.LiveBytes is zero without the CUDA view), and whether or not
// Start succeeded (then there is nothing to join).
func (s *Sampler) Enrich(p *model.Process) { s.EnrichAll([]*model.Process{p}) }

// EnrichAll enriches each of procs as Enrich does; the processes its
// faults list (model.GPUEvent.Processes) are named by the comm of those
// among procs, the others by pid alone.
func (s *Sampler) EnrichAll(procs []*model.Process) {
	events := s.namedEvents(procs)
	for _, p := range procs {
		used, ok := s.ProcessMemory(p.PID)
		Join(p, used, ok)
		p.CUDA.GPUUtil = s.Utilization(p.PID)
		p.CUDA.GPUEvents = s.eventsOf(p.PID, events)
	}
}

// namedEvents returns the faults of the last window with the comm of each
// process of procs they list: copies, for the window's own are shared.
func (s *Sampler) namedEvents(procs []*model.Process) []model.GPUEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rolledEvents) == 0 {
		return nil
	}
	names := make(map[int]string, len(procs))
	for _, p := range procs {
		names[p.PID] = p.Comm
	}
	out := slices.Clone(s.rolledEvents)
	for i := range out {
		ps := slices.Clone(out[i].Processes)
		for j := range ps {
			ps[j].Comm = names[ps[j].PID]
		}
		out[i].Processes = ps
	}
	return out
}

// eventsOf returns those of events (the faults of the last window) on the
// devices pid used: those NVML listed it on, or it ran on. On a GPU in MIG
// mode, a fault an event pins to a GPU instance goes only to the
// processes on that instance: one tenant's illegal address is not its
// neighbours'.
func (s *Sampler) eventsOf(pid int, events []model.GPUEvent) []model.GPUEvent {
	if len(events) == 0 {
		return nil
	}
	s.mu.Lock()
	u := s.rolledUse[pid]
	s.mu.Unlock()
	var out []model.GPUEvent
	for _, e := range events {
		if u.concerns(e) {
			out = append(out, e)
		}
	}
	return out
}

// devUse is where a process ran in a window: the GPUs it used whole (or on
// a MIG instance whose GPU instance is not known), and on the others the
// GPU instances it used.
type devUse struct {
	whole     map[int]bool
	instances map[int]map[uint32]bool // by GPU
}

// concerns reports whether the fault e concerns a process that ran where
// u says.
func (u devUse) concerns(e model.GPUEvent) bool {
	on := u.instances[e.Device]
	return u.whole[e.Device] || on != nil && (e.GPUInstance == model.NoInstance || on[e.GPUInstance])
}

// uses returns where each process ran in the closed window, by pid: the
// devices NVML listed it on, or sampled its utilization on. s.mu is held.
func (s *Sampler) uses() map[int]devUse {
	instance := map[devKey]uint32{} // of the MIG devices
	used := map[int]map[devKey]bool{}
	add := func(pid int, k devKey) {
		if used[pid] == nil {
			used[pid] = map[devKey]bool{}
		}
		used[pid][k] = true
	}
	for _, g := range s.rolledGPUs {
		k := keyOf(g.Index, g.MIG)
		for pid := range g.Processes {
			add(pid, k)
		}
		if g.MIG != nil {
			instance[k] = g.GPUInstance
		}
	}
	for pid, us := range s.rolledUtil {
		for _, u := range us {
			add(pid, keyOf(u.Device, u.MIG))
		}
	}
	out := make(map[int]devUse, len(used))
	for pid, ks := range used {
		u := devUse{whole: map[int]bool{}, instances: map[int]map[uint32]bool{}}
		for k := range ks {
			gi, ok := instance[k]
			if !ok || gi == model.NoInstance {
				u.whole[k.index] = true
				continue
			}
			if u.instances[k.index] == nil {
				u.instances[k.index] = map[uint32]bool{}
			}
			u.instances[k.index][gi] = true
		}
		out[pid] = u
	}
	return out
}

// Probe initializes NVML once and describes what it finds, for `check`.
func Probe(lib gonvml.Interface) (string, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return "", unavailable(ret)
	}
	defer lib.Shutdown()
	driver, ret := lib.SystemGetDriverVersion()
	if ret != gonvml.SUCCESS {
		driver = "unknown"
	}
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return "", fmt.Errorf("NVML: counting devices: %s", ret.Error())
	}
	out := fmt.Sprintf("driver %s, %d devices", driver, n)
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			out += fmt.Sprintf("; GPU %d: %s", i, ret.Error())
			continue
		}
		migs, mig := migInstances(dev, i)
		var util string
		if mig {
			// Per-process figures are the instances', listed next.
			util = fmt.Sprintf("MIG mode, %d instances", len(migs))
		} else {
			util = utilization(dev)
		}
		out += fmt.Sprintf("; GPU %d: %s, %s", i, util, supportedEvents(dev))
		for _, m := range migs {
			out += fmt.Sprintf("; GPU %s: %s", model.DeviceLabel(i, &m.index), utilization(m.dev))
		}
	}
	return out, nil
}

// utilization says which utilization figures dev gives: per process, or
// only the device's that sampling then lends each process on it, or none.
func utilization(dev gonvml.Device) string {
	_, ret := dev.GetProcessUtilization(0)
	if ret == gonvml.SUCCESS || ret == gonvml.ERROR_NOT_FOUND { // NOT_FOUND: no sample yet
		return "per-process utilization"
	}
	if _, dret := dev.GetUtilizationRates(); dret != gonvml.SUCCESS {
		return fmt.Sprintf("no utilization (per process: %s, device: %s)", ret.Error(), dret.Error())
	}
	return "device utilization only (no per-process samples: " + ret.Error() + ")"
}

// supportedEvents lists the kinds of the watched NVML event types dev
// reports.
func supportedEvents(dev gonvml.Device) string {
	types, ret := dev.GetSupportedEventTypes()
	if ret != gonvml.SUCCESS {
		return "no events (" + ret.Error() + ")"
	}
	var kinds []string
	for _, t := range eventTypes {
		if types&t.mask != 0 {
			kinds = append(kinds, t.kind)
		}
	}
	if len(kinds) == 0 {
		return "no events"
	}
	return "events " + strings.Join(kinds, " ")
}

// ErrUnavailable is wrapped by the errors of Start and Probe when NVML
// cannot be initialized.
var ErrUnavailable = errors.New("NVML unavailable")

// ErrNoLibrary is wrapped, with ErrUnavailable, when libnvidia-ml cannot be
// loaded: NVML was not installed or not given to this container, which is
// no fault on a node that is not meant to have it (gpunode).
var ErrNoLibrary = errors.New("libnvidia-ml.so.1 not found")

// ErrNoDevices is wrapped, with ErrUnavailable, by Start on a sampler
// without a library (New(nil)): the agent was given no GPU device node,
// through which NVML reaches the GPUs, so libnvidia-ml is not loaded at all.
var ErrNoDevices = errors.New("no NVIDIA device node in the agent's /dev")

// unavailable explains a failed nvmlInit in the terms a user can act on.
func unavailable(ret gonvml.Return) error {
	var reason string
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: %w (no NVIDIA driver installed, or not given to this container); GPU metrics off", ErrUnavailable, ErrNoLibrary)
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		reason = "the NVIDIA kernel driver is not loaded"
	case gonvml.ERROR_NO_PERMISSION:
		reason = "no permission to open the NVIDIA device files"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		reason = "libnvidia-ml and the kernel driver versions differ (reboot or reinstall the driver)"
	default:
		reason = ret.Error()
	}
	return fmt.Errorf("%w: %s; GPU metrics off", ErrUnavailable, reason)
}
