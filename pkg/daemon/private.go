package daemon

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v2"
)

// access decides who gets what HandlePrivate serves. The profiles hold the
// call stacks, file paths and function names of every watched process (of
// every pod on the node, in the daemon): far more than an exporter's
// metrics, so they are not served to whoever reaches the port, as /metrics
// is. They are served to
//   - loopback clients: kubectl port-forward and `kubectl exec … curl
//     localhost` connect from inside the pod's network namespace, and on a
//     host only its own users can;
//   - clients the web config authenticates: exporter-toolkit refuses every
//     request without valid basic auth credentials before our handler runs
//     when basic_auth_users is set, and a client certificate verified
//     against client_ca_file shows in the request's TLS state;
//   - everyone, with --web.expose-profiles.
//
// Who the client is comes from the accepted connection's address
// (r.RemoteAddr), never from a header such as X-Forwarded-For, which any
// client can write.
type access struct {
	webConfig string
	expose    bool
}

// allowed reports whether r may read a private endpoint.
func (a access) allowed(r *http.Request) bool {
	if a.expose || loopback(r.RemoteAddr) {
		return true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	// exporter-toolkit reads the file at every request, so it is read
	// again here: one edited to drop basic_auth_users must not leave the
	// profiles open. Credentials reaching this handler while users are set
	// are ones exporter-toolkit checked.
	if _, _, ok := r.BasicAuth(); ok && a.webConfig != "" {
		c, err := readWebConfig(a.webConfig)
		return err == nil && len(c.Users) > 0
	}
	return false
}

// loopback reports whether addr (host:port, as http.Request.RemoteAddr) is
// a loopback address: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6 (a
// dual-stack listener's view of an IPv4 client). Anything unparsable is not.
func loopback(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// readWebConfig reads an exporter-toolkit web config file as exporter-toolkit
// does (its own reader is not exported).
func readWebConfig(path string) (*web.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c web.Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// authMethods are the ways the web config file authenticates clients, as
// a phrase for the log; "" when it does not.
func (a access) authMethods() string {
	if a.webConfig == "" {
		return ""
	}
	c, err := readWebConfig(a.webConfig)
	if err != nil {
		return "" // Listen validated it: only a file changed since then
	}
	var m []string
	if len(c.Users) > 0 {
		m = append(m, "basic auth")
	}
	// RequestClientCert and RequireAnyClientCert take a certificate without
	// verifying it: no authentication.
	if slices.Contains([]string{"VerifyClientCertIfGiven", "RequireAndVerifyClientCert"}, c.TLSConfig.ClientAuth) {
		m = append(m, "client certificate")
	}
	return strings.Join(m, ", ")
}

// logPolicy says at start to whom the private endpoints are served.
func (a access) logPolicy(paths []string) {
	p := strings.Join(paths, ", ")
	switch auth := a.authMethods(); {
	case a.expose:
		slog.Info("serving "+p+" to every client that reaches the port (--web.expose-profiles)", "exposes", "the call stacks, file paths and function names of every watched process")
	case auth != "":
		slog.Info("serving "+p+" to loopback clients and to clients --web.config.file authenticates", "by", auth)
	default:
		slog.Info("serving "+p+" to loopback clients only (kubectl port-forward); other clients get 403", "enable", enableHint)
	}
}

// enableHint says how to serve the private endpoints to other clients.
const enableHint = "set basic_auth_users (or client_auth_type with client_ca_file) in --web.config.file, or pass --web.expose-profiles"

// private serves h to the clients a allows, and 403 with the reason to
// the others.
func (a access) private(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.allowed(r) {
			http.Error(w, fmt.Sprintf("%s holds the call stacks, file paths and function names of the watched processes: "+
				"it is served to loopback clients (kubectl port-forward) and authenticated ones only. To serve it to others, %s.",
				r.URL.Path, enableHint), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
