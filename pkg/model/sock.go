package model

import (
	"fmt"
	"time"
)

// Finding kinds of the socket view, as they appear in reports, metrics and
// --fail-on.
const (
	KindSocketLeak = "socket_leak"
)

// SockStats is the socket view of one process at one instant.
type SockStats struct {
	TCPByState map[string]int // TCP sockets by state name (ESTABLISHED, CLOSE_WAIT, ...)
	ByKind     map[string]int // live socket fds by kind (tcp, udp, unix, other) from the fd table
	CloseWait  []SockConn     // sockets sitting in CLOSE_WAIT, oldest first
}

// TCPStates names the TCP states of SockStats.TCPByState, in the kernel's
// order (include/net/tcp_states.h, from 1).
var TCPStates = []string{"ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT",
	"CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING", "NEW_SYN_RECV"}

// SockKinds are the kinds of SockStats.ByKind.
var SockKinds = []string{"tcp", "udp", "unix", "other"}

// SockConn is one TCP connection of a process.
type SockConn struct {
	Local  string // ip:port
	Remote string // ip:port
	State  string
	Since  time.Time // when it entered State
	Stack  []Frame   // opening stack, from the fd table where known
	FD     int       // the process's fd for the socket (its lowest, if several)
}

// SocketLeakEvidence is a socket_leak's evidence.
type SocketLeakEvidence struct {
	CloseWait             int `json:"close_wait"`
	CloseWaitOlderThanMin int `json:"close_wait_older_than_min"`
	// FDGrowth is that of the fd leak these sockets explain (pkg/detect/causes);
	// nil when there is none.
	FDGrowth               *FDGrowth      `json:"fd_growth,omitempty"`
	FDLimit                uint64         `json:"fd_limit"`
	GrowthPerSecond        float64        `json:"growth_per_second"`
	MinAgeSeconds          float64        `json:"min_age_seconds"`
	OldestCloseWaitSeconds float64        `json:"oldest_close_wait_seconds"`
	OpeningStackSockets    int            `json:"opening_stack_sockets"`
	TCPByState             map[string]int `json:"tcp_by_state"`
	// TimeToFDLimitSeconds is nil when the sockets do not grow towards a
	// known fd limit.
	TimeToFDLimitSeconds *float64     `json:"time_to_fd_limit_seconds"`
	TopPairs             []SocketPair `json:"top_pairs"`
	WindowSeconds        float64      `json:"window_seconds"`
}

// SocketPair counts the CLOSE_WAIT sockets of one address pair, ephemeral
// port masked.
type SocketPair struct {
	Count  int    `json:"count"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
}

// FDGrowth is the growth of an fd leak, as its evidence had it.
type FDGrowth struct {
	FDLeakFirstSeen         time.Time `json:"fd_leak_first_seen"`
	GrowthPerSecond         float64   `json:"growth_fds_per_second"`
	Limit                   uint64    `json:"limit"`
	OpenFDs                 int       `json:"open_fds"`
	TimeToExhaustionSeconds *float64  `json:"time_to_exhaustion_seconds"`
	WindowSeconds           float64   `json:"window_seconds"`
}

func (e SocketLeakEvidence) EvidenceKind() string { return KindSocketLeak }

func (e SocketLeakEvidence) Card(c Card) {
	c.Count("close_wait", "CLOSE_WAIT sockets", e.CloseWait)
	c.Count("close_wait_older_than_min", "older than min age", e.CloseWaitOlderThanMin)
	c.Duration("min_age_seconds", "min age", e.MinAgeSeconds)
	c.Duration("oldest_close_wait_seconds", "oldest CLOSE_WAIT", e.OldestCloseWaitSeconds)
	c.Rate("growth_per_second", "growth", e.GrowthPerSecond, "sockets/s")
	c.Duration("window_seconds", "window", e.WindowSeconds)
	c.CountUint64("fd_limit", "fd limit", e.FDLimit)
	if e.TimeToFDLimitSeconds != nil {
		c.Duration("time_to_fd_limit_seconds", "time to fd limit", *e.TimeToFDLimitSeconds)
	}
	c.CountsInt("tcp_by_state", "TCP by state", e.TCPByState)
	c.Count("opening_stack_sockets", "sockets with their opening stack", e.OpeningStackSockets)
	if g := e.FDGrowth; g != nil {
		c.Phrase("fd_growth", "fd leak explained", func(p Card) {
			p.Rate("growth_fds_per_second", "", g.GrowthPerSecond, "fds/s")
			p.Text("open_fds", "", fmt.Sprintf("%d of %d open", g.OpenFDs, g.Limit))
			if g.TimeToExhaustionSeconds != nil {
				p.Duration("time_to_exhaustion_seconds", "limit in", *g.TimeToExhaustionSeconds)
			}
			p.Duration("window_seconds", "over", g.WindowSeconds)
			p.Time("fd_leak_first_seen", "since", g.FDLeakFirstSeen)
		})
	}
	var pairs []Row
	for _, p := range e.TopPairs {
		pairs = append(pairs, Row{Cells: []Cell{TextCell(p.Local), TextCell(p.Remote), CountCell(p.Count)}})
	}
	c.Table("top_pairs", "CLOSE_WAIT by address pair", []string{"local", "remote", "sockets"}, pairs)
}

// The evidence of the view's kinds reads into their structs.
func init() {
	registerEvidence[SocketLeakEvidence]()
}

// The sock view's series in a report's history, and its chart.
const (
	// SeriesTCPPrefix + a state as the kernel names it (TCP_CLOSE_WAIT
	// is "tcp_CLOSE_WAIT"): sockets the process holds in that state.
	SeriesTCPPrefix = "tcp_"

	ChartTCP = "tcp_sockets"
)

var sockShown = Shown{
	View: "sock",
	Metrics: []Metric{
		// The states it holds sockets in: a process has a few of the
		// twelve, and zeros would be most of the node's series (a state it
		// no longer holds goes stale).
		{Name: "autoglm_sockets", Help: "TCP sockets the process holds, by state; states it holds none in are left out.", Type: GaugeMetric, Labels: []string{"state"},
			Samples: func(p *Process, add func(float64, ...string)) {
				for _, st := range TCPStates {
					if n := p.Sock.TCPByState[st]; n > 0 {
						add(float64(n), st)
					}
				}
			}},
		// Every kind, zeros included, once the view filled them.
		{Name: "autoglm_socket_fds", Help: "Socket file descriptors of the process, by kind (tcp, udp, unix, other).", Type: GaugeMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) {
				if p.Sock.ByKind != nil {
					for _, k := range SockKinds {
						add(float64(p.Sock.ByKind[k]), k)
					}
				}
			}},
	},
	Figures: []Figure{
		{Name: SeriesTCPPrefix, Unit: UnitSockets, Kind: Gauge, Members: func(p *Process) map[string]int { return p.Sock.TCPByState }},
	},
	Charts: []Chart{
		{ID: ChartTCP, Title: "TCP sockets by state", Unit: UnitSockets, Empty: "no TCP sockets", Rank: 60, Lines: tcpLines(),
			Marks: []string{KindSocketLeak}},
	},
}

// tcpLines are the lines of the TCP chart, one per state in the kernel's
// order.
func tcpLines() []Line {
	palette := []string{"blue", "green", "purple", "brown", "pink", "teal", "orange", "grey"}
	var out []Line
	for i, st := range TCPStates {
		color := palette[i%len(palette)]
		if st == "CLOSE_WAIT" {
			color = "red" // the state a socket leak piles up in
		}
		out = append(out, Line{Series: SeriesTCPPrefix + st, Label: st, Color: color})
	}
	return out
}
