package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
)

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9464":          true,
		"127.3.2.1:9464":          true,
		"[::1]:9464":              true,
		"[::ffff:127.0.0.1]:9464": true, // an IPv4 client of a dual-stack listener
		"192.0.2.2:9464":          false,
		"[::ffff:192.0.2.2]:9464": false,
		"[fe80::1%eth0]:9464":     false,
		"[2001:db8::1]:9464":      false,
		"localhost:9464":          false, // never a name: RemoteAddr is an address
		"127.0.0.1":               false,
		"":                        false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// hostIPv4 is a non-loopback IPv4 address of this machine, for requests
// that come from elsewhere than loopback.
func hostIPv4(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address to make a non-loopback request from")
	return nil
}

// profileBody is what the private endpoint of serveOn answers.
const profileBody = "stacks of every watched process"

// serveOn serves a registry's /metrics and a private /debug/pprof/fd on
// every interface (0.0.0.0) at a free port, and returns the port.
func serveOn(t *testing.T, webConfig string, expose bool) string {
	t.Helper()
	s, err := Listen("0.0.0.0:0", webConfig, expose)
	if err != nil {
		t.Fatal(err)
	}
	s.HandlePrivate("/debug/pprof/fd", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, profileBody)
	}))
	s.Serve(prometheus.NewRegistry(), nil, 0)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
}

// client makes its requests from the local address from, so that the
// server sees that address as the client's, with tc for HTTPS (nil: HTTP).
func client(from net.IP, tc *tls.Config) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     d.DialContext,
		TLSClientConfig: tc,
	}}
}

type request struct {
	c              *http.Client
	url            string
	user, password string            // basic auth, if user is set
	header         map[string]string // more headers
}

// get returns the status and body of a GET of r.
func (r request) get(t *testing.T) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.user != "" {
		req.SetBasicAuth(r.user, r.password)
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := r.c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", r.url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The profiles go to loopback clients, to everyone with expose, and to the
// clients basic auth lets through; /metrics to every client, as an
// exporter's. The server listens on every interface; requests come from
// one of this machine's non-loopback addresses, to it, or from 127.0.0.1.
func TestPrivateEndpoints(t *testing.T) {
	ip := hostIPv4(t)
	remote, local := client(ip, nil), client(net.IPv4(127, 0, 0, 1), nil)
	urls := func(host, port string) (profile, metrics string) {
		base := "http://" + net.JoinHostPort(host, port)
		return base + "/debug/pprof/fd", base + "/metrics"
	}

	t.Run("default", func(t *testing.T) {
		port := serveOn(t, "", false)
		profile, metrics := urls(ip.String(), port)
		code, body := request{c: remote, url: profile}.get(t)
		if code != http.StatusForbidden || !strings.Contains(body, "--web.expose-profiles") || !strings.Contains(body, "basic_auth_users") {
			t.Errorf("profile from %s: %d %q, want 403 saying how to enable it", ip, code, body)
		}
		// A header is the client's own word: it does not make it local.
		spoofed := map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Real-Ip": "127.0.0.1", "Forwarded": "for=127.0.0.1"}
		if code, _ := (request{c: remote, url: profile, header: spoofed}).get(t); code != http.StatusForbidden {
			t.Errorf("profile from %s claiming 127.0.0.1 in headers: %d, want 403", ip, code)
		}
		// Credentials no web config asks for authenticate nothing.
		if code, _ := (request{c: remote, url: profile, user: "prom", password: "x"}).get(t); code != http.StatusForbidden {
			t.Errorf("profile from %s with unchecked basic auth: %d, want 403", ip, code)
		}
		if code, _ := (request{c: remote, url: metrics}).get(t); code != http.StatusOK {
			t.Errorf("/metrics from %s: %d, want 200", ip, code)
		}
		profile, _ = urls("127.0.0.1", port)
		if code, body := (request{c: local, url: profile}).get(t); code != http.StatusOK || body != profileBody {
			t.Errorf("profile from 127.0.0.1: %d %q, want 200", code, body)
		}
	})

	t.Run("expose", func(t *testing.T) {
		profile, _ := urls(ip.String(), serveOn(t, "", true))
		if code, body := (request{c: remote, url: profile}).get(t); code != http.StatusOK || body != profileBody {
			t.Errorf("profile from %s with expose: %d %q, want 200", ip, code, body)
		}
	})

	t.Run("basic auth", func(t *testing.T) {
		hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		webConfig := filepath.Join(t.TempDir(), "web.yml")
		if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  prom: "+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		port := serveOn(t, webConfig, false)
		profile, metrics := urls(ip.String(), port)
		if code, _ := (request{c: remote, url: profile}).get(t); code != http.StatusUnauthorized {
			t.Errorf("profile from %s without credentials: %d, want 401", ip, code)
		}
		if code, _ := (request{c: remote, url: profile, user: "prom", password: "wrong"}).get(t); code != http.StatusUnauthorized {
			t.Errorf("profile from %s with a wrong password: %d, want 401", ip, code)
		}
		if code, body := (request{c: remote, url: profile, user: "prom", password: "s3cret"}).get(t); code != http.StatusOK || body != profileBody {
			t.Errorf("profile from %s with credentials: %d %q, want 200", ip, code, body)
		}
		if code, _ := (request{c: remote, url: metrics, user: "prom", password: "s3cret"}).get(t); code != http.StatusOK {
			t.Errorf("/metrics from %s with credentials: %d, want 200", ip, code)
		}
		profile, _ = urls("127.0.0.1", port)
		if code, _ := (request{c: local, url: profile, user: "prom", password: "s3cret"}).get(t); code != http.StatusOK {
			t.Errorf("profile from 127.0.0.1 with credentials: %d, want 200", code)
		}
		// exporter-toolkit reads the file at each request: with the users
		// gone, credentials authenticate nothing and the profile is closed
		// again, not left open.
		if err := os.WriteFile(webConfig, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		profile, _ = urls(ip.String(), port)
		if code, _ := (request{c: remote, url: profile, user: "prom", password: "s3cret"}).get(t); code != http.StatusForbidden {
			t.Errorf("profile from %s after basic_auth_users was removed: %d, want 403", ip, code)
		}
	})

	// A client certificate asked for but optional: /metrics (and the
	// kubelet's probes) need none, the profiles a verified one.
	t.Run("client certificate", func(t *testing.T) {
		dir := t.TempDir()
		pki := newPKI(t, dir, ip)
		webConfig := filepath.Join(dir, "web.yml")
		cfg := "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n"
		if err := os.WriteFile(webConfig, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		port := serveOn(t, webConfig, false)
		base := "https://" + net.JoinHostPort(ip.String(), port)
		anonymous := client(ip, &tls.Config{RootCAs: pki.roots})
		withCert := client(ip, &tls.Config{RootCAs: pki.roots, Certificates: []tls.Certificate{pki.client}})
		if code, _ := (request{c: anonymous, url: base + "/debug/pprof/fd"}).get(t); code != http.StatusForbidden {
			t.Errorf("profile from %s without a client certificate: %d, want 403", ip, code)
		}
		if code, _ := (request{c: anonymous, url: base + "/metrics"}).get(t); code != http.StatusOK {
			t.Errorf("/metrics from %s without a client certificate: %d, want 200", ip, code)
		}
		if code, body := (request{c: withCert, url: base + "/debug/pprof/fd"}).get(t); code != http.StatusOK || body != profileBody {
			t.Errorf("profile from %s with a verified client certificate: %d %q, want 200", ip, code, body)
		}
	})
}

// pki is a CA, a server certificate for 127.0.0.1 and ip signed by it
// (written as ca.crt, server.crt and server.key), and a client
// certificate signed by it.
type pki struct {
	roots  *x509.CertPool
	client tls.Certificate
}

func newPKI(t *testing.T, dir string, ip net.IP) pki {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(0)
	sign := func(tmpl *x509.Certificate, pub *ecdsa.PublicKey, parent *x509.Certificate, signer *ecdsa.PrivateKey) *x509.Certificate {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	ca := sign(&x509.Certificate{Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, &caKey.PublicKey, nil, caKey)
	write("ca.crt", "CERTIFICATE", ca.Raw)

	serverKey := key()
	server := sign(&x509.Certificate{Subject: pkix.Name{CommonName: "agent"}, IPAddresses: []net.IP{ip, net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &serverKey.PublicKey, ca, caKey)
	write("server.crt", "CERTIFICATE", server.Raw)
	der, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		t.Fatal(err)
	}
	write("server.key", "EC PRIVATE KEY", der)

	clientKey := key()
	client := sign(&x509.Certificate{Subject: pkix.Name{CommonName: "pyroscope"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &clientKey.PublicKey, ca, caKey)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return pki{roots: roots, client: tls.Certificate{Certificate: [][]byte{client.Raw}, PrivateKey: clientKey, Leaf: client}}
}
