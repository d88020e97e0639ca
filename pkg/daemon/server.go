package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/open-autoglm/autoglm-ebpf/pkg/metrics"
)

// Server serves /metrics, /healthz and /readyz to every client, as an
// exporter does, and what HandlePrivate adds to fewer (access), with TLS
// and basic auth from an exporter-toolkit web config file as node_exporter
// does.
type Server struct {
	srv     *http.Server
	ln      net.Listener
	done    chan error
	access  access
	private map[string]http.Handler
}

// HandlePrivate adds a handler for pattern that serves what only some may
// read (the call stacks, file paths and function names of the watched
// processes): to loopback clients, to those the web config authenticates,
// and to everyone with expose (Listen); others get 403 saying why. Before
// Serve.
func (s *Server) HandlePrivate(pattern string, h http.Handler) {
	if s.private == nil {
		s.private = map[string]http.Handler{}
	}
	s.private[pattern] = s.access.private(h)
}

// Listen binds addr now, so that a port in use is an error at start, and
// checks the web config file (empty: plain HTTP, no auth). expose serves
// what HandlePrivate adds to every client.
func Listen(addr, webConfig string, expose bool) (*Server, error) {
	if webConfig != "" {
		if err := web.Validate(webConfig); err != nil {
			return nil, fmt.Errorf("--web.config.file %s: %w", webConfig, err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--web.listen-address %s: %w", addr, err)
	}
	return &Server{ln: ln, done: make(chan error, 1), access: access{webConfig: webConfig, expose: expose}}, nil
}

// Addr is the address bound.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve starts serving in the background: metrics gathered from g (text,
// OpenMetrics or protobuf, as the scraper asks) and, with h (the daemon),
// /healthz healthy while the loop ticked within stale and /readyz ready once
// a poll saw the views h requires up.
func (s *Server) Serve(g prometheus.Gatherer, h *Health, stale time.Duration) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(g))
	for pattern, ph := range s.private {
		mux.Handle(pattern, ph)
	}
	if h != nil {
		healthHandlers(mux, h, stale)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	flags := &web.FlagConfig{WebListenAddresses: &[]string{s.ln.Addr().String()}, WebConfigFile: &s.access.webConfig}
	go func() {
		err := web.Serve(s.ln, s.srv, flags, slog.Default())
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	slog.Info("serving", "metrics", "http://"+s.ln.Addr().String()+"/metrics")
	if len(s.private) > 0 {
		s.access.logPolicy(slices.Sorted(maps.Keys(s.private)))
	}
}

// Close stops serving.
func (s *Server) Close() error {
	if s.srv == nil {
		return s.ln.Close()
	}
	err := s.srv.Close()
	if serr := <-s.done; serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}

// healthHandlers adds /healthz and /readyz.
func healthHandlers(mux *http.ServeMux, h *Health, stale time.Duration) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		ago, ok := h.Since()
		switch {
		case !ok:
			http.Error(w, "the loop has not ticked yet", http.StatusServiceUnavailable)
		case ago > stale:
			http.Error(w, fmt.Sprintf("the loop last ticked %s ago", ago.Round(time.Millisecond)), http.StatusServiceUnavailable)
		default:
			fmt.Fprintf(w, "ok: last tick %s ago\n", ago.Round(time.Millisecond))
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
