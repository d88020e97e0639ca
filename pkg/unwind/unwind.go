// Package unwind serves the user-stack unwinding of a BPF object that
// includes bpf/unwind.h: the kernel walks stacks with per-instruction rules
// and asks, through a ring buffer, for every frame it has no rule for. The
// Server finishes that stack from the kernel's copy of the stack with the
// binaries' call-frame information (pkg/symbolize), stores it under the id
// the kernel chose, and teaches the kernel the rules it used, so that the
// next stack through the same code is unwound in the kernel alone. Rules
// are kept by file and file offset, for every process that maps the file:
// the Server keeps the trie of each tracked process's code mappings that
// the kernel finds files by (mappings.go).
//
// pkg/stacks creates the maps once for every object and reaches them
// through Tables.
package unwind

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// RequestIDs is UNWIND_REQUEST_IDS: stack ids from it up were handed to a
// request, those below are hashes of the frames.
const RequestIDs = 0x40000000

// Request is one unwind request, decoded from the owner's generated type.
type Request struct {
	MM      uint64
	ASID    uint64 // the address space whose mappings the kernel looked for (ASID)
	Hash    uint64 // of PCs: with MM, the request's key among those in flight
	TGID    uint32
	StackID int32
	SP, BP  uint64
	LR      uint64   // the link register where PCs' last is the innermost frame's (AArch64), else 0
	Exact   bool     // PCs' last is an instruction pointer, not a return address
	Max     int      // frames wanted in all
	PCs     []uint64 // frames so far; the last is the one without a rule
	Stack   []byte   // from SP up
}

// Tables are the owner's BPF maps of bpf/unwind.h.
type Tables interface {
	// Decode turns a ring buffer record into a Request.
	Decode(raw []byte) (Request, error)
	// SetRule stores the rule of offset at in code file (a file's id, or
	// the own code of a process's address space: ownCode).
	SetRule(file, at uint64, r symbolize.Rule) error
	// DropRules deletes the rules of the code for which live is false.
	DropRules(live func(file uint64) bool) error
	// SetMapping enters one block of a code mapping into the trie, and
	// DeleteMapping takes it out.
	SetMapping(b Block, m symbolize.CodeMapping) error
	DeleteMapping(b Block) error
	// SetStack stores a finished stack.
	SetStack(id int32, pcs []uint64, truncated bool) error
	// Stack reads a stack.
	Stack(id int32) ([]uint64, error)
	// Done says a request was answered: events that stop where it did
	// no longer join it (its rules are in, they walk on).
	Done(mm, hash uint64) error
}

// Server answers one object's requests on a goroutine of its own, so that
// the kernel learns a site's rules within microseconds, not at the next
// poll. Canonical and Forget belong to the owner's poll goroutine; Learn
// and Drop may be called from any.
type Server struct {
	tables       Tables
	sym          *symbolize.Symbolizer
	layout       func(pid int) (procinfo.Layout, error)
	done         chan struct{}
	rulesLost    atomic.Uint64
	stacksLost   atomic.Uint64
	mappingsLost atomic.Uint64
	canon        map[int32]int32  // stack id -> the first id with its frames
	byFrames     map[string]int32 // frames -> that first id
	waited       map[int32]bool   // request ids waited for once in vain

	// mu guards the processes known and what the trie holds of them.
	mu    sync.Mutex
	procs map[uint32]*proc
	files map[uint64]int // the known processes' mappings of each file
}

// newServer is a Server that answers nothing yet; fs reads the processes'
// layouts.
func newServer(t Tables, sym *symbolize.Symbolizer, fs procinfo.FS) *Server {
	return &Server{tables: t, sym: sym, layout: fs.Layout, done: make(chan struct{}),
		canon: map[int32]int32{}, byFrames: map[string]int32{}, waited: map[int32]bool{},
		procs: map[uint32]*proc{}, files: map[uint64]int{}}
}

// Serve starts answering the requests of r; they stop when r is closed
// (then Wait).
func Serve(r *ringbuf.Reader, t Tables, sym *symbolize.Symbolizer, fs procinfo.FS) *Server {
	s := newServer(t, sym, fs)
	go s.serve(r)
	return s
}

func (s *Server) serve(r *ringbuf.Reader) {
	defer close(s.done)
	var rec ringbuf.Record
	for {
		if err := r.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			slog.Warn("reading unwind requests", "err", err)
			continue
		}
		req, err := s.tables.Decode(rec.RawSample)
		if err != nil {
			slog.Warn("decoding an unwind request", "err", err)
			continue
		}
		s.answer(req)
	}
}

// Wait returns once the goroutine has stopped (its reader closed).
func (s *Server) Wait() { <-s.done }

// answer finishes the stack of one request and stores the rules it used,
// under the keys the kernel will look them up by: where the trie maps a
// file, the file's; first entering the process's mappings into the trie
// if they are not there (its first request, when it was not learnt at
// Track: an exec), or not as the rules found them (dlopen).
func (s *Server) answer(req Request) {
	n := len(req.PCs)
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[req.TGID]
	if p == nil || p.asid != req.ASID {
		p = s.learn(req.TGID, req.ASID)
	}
	more, rules := s.sym.UnwindCopy(int(req.TGID), symbolize.StackCopy{
		PC: req.PCs[n-1], SP: req.SP, BP: req.BP, LR: req.LR, Exact: req.Exact, RAMask: RAMask(), Stack: req.Stack,
	}, req.Max-n)
	if p != nil && p.stale(rules) {
		p = s.learn(req.TGID, req.ASID)
	}
	// p is nil where the process has exec'd since: its rules would be of
	// an image that is gone.
	for addr, r := range rules {
		if p == nil {
			break
		}
		file, at, ok := p.key(req.TGID, addr, r)
		if !ok {
			continue
		}
		if err := s.tables.SetRule(file, at, r.Rule); err != nil {
			// Full: the kernel keeps asking for these frames and each
			// request still gets its stack, at a copy's cost.
			s.rulesLost.Add(1)
		}
	}
	pcs := append(req.PCs[:n:n], more...)
	if err := s.tables.SetStack(req.StackID, pcs, len(pcs) >= req.Max); err != nil {
		s.stacksLost.Add(1)
	}
	// Gone already when the LRU dropped it.
	_ = s.tables.Done(req.MM, req.Hash)
}

// requestWait bounds the wait for a request in flight: the kernel sent it
// before the event it belongs to was recorded, and serving one takes well
// under a millisecond once the files are open.
const requestWait = 100 * time.Millisecond

// Settled reports whether Canonical(id) will not change: the stack was
// found, or id names none.
func (s *Server) Settled(id int32) bool {
	_, ok := s.canon[id]
	return ok || id < 0
}

// Canonical returns the id under which a stack is first known. The first
// event of a site gets a request's id and later ones the id of the kernel's
// own walk, for the same frames: one site must be one id. An id whose stack
// is not there (gone, or a request not served in time) is returned as is
// and looked at again next time.
func (s *Server) Canonical(id int32) int32 {
	if id < 0 {
		return id
	}
	if c, ok := s.canon[id]; ok {
		return c
	}
	pcs, err := s.tables.Stack(id)
	if err != nil && id >= RequestIDs && !s.waited[id] {
		// Once per id: a stack that could not be stored (map full) must
		// not hold up every poll.
		s.waited[id] = true
		for deadline := time.Now().Add(requestWait); err != nil && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			pcs, err = s.tables.Stack(id)
		}
	}
	if err != nil {
		return id
	}
	b := make([]byte, 0, 8*len(pcs))
	for _, pc := range pcs {
		b = binary.NativeEndian.AppendUint64(b, pc)
	}
	c, ok := s.byFrames[string(b)]
	if !ok {
		c = id
		s.byFrames[string(b)] = id
	}
	s.canon[id] = c
	return c
}

// Forget drops the canonical ids of stacks deleted from the map (kept is
// false), and the ids mapped to them: a stack still there is looked at
// afresh. Ids waited for in vain are forgotten once nothing refers to them.
func (s *Server) Forget(kept, referenced func(id uint32) bool) {
	for id, c := range s.canon {
		if !kept(uint32(id)) || !kept(uint32(c)) {
			delete(s.canon, id)
		}
	}
	for k, id := range s.byFrames {
		if !kept(uint32(id)) {
			delete(s.byFrames, k)
		}
	}
	for id := range s.waited {
		if !referenced(uint32(id)) {
			delete(s.waited, id)
		}
	}
}

// Lost adds what this side could not store to out, under prefix: rules
// ("<prefix>_unwind_rules"), code mappings ("<prefix>_unwind_mappings")
// and stacks ("<prefix>_stack").
func (s *Server) Lost(prefix string, out map[string]uint64) {
	out[prefix+"_unwind_rules"] = s.rulesLost.Load()
	out[prefix+"_unwind_mappings"] = s.mappingsLost.Load()
	out[prefix+"_stack"] += s.stacksLost.Load()
}
