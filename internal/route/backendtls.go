package route

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/certs"
)

// backendTLS is how a scheduler with appProtocol https checks its model
// servers: against the CAs of a bundle file (reread as it changes) or the
// system's, for the configured server name or else the endpoint's host. Each
// connection gets its own tls.Config, built from the bundle's current pool,
// so a rotated CA applies to the next handshake without a restart. With a
// client certificate, it is presented to servers that ask for one (mTLS),
// read again from its files as the listener's is, so a rotated one is used
// from the next handshake on.
type backendTLS struct {
	serverName string
	ca         *caBundle    // nil: the system's CAs
	client     *certs.Files // nil: no client certificate
}

// newBackendTLS builds a scheduler's backend TLS; field prefixes its errors
// ("spec.schedulers[0].backendTLS"). A bundle that cannot be read or holds
// no certificate is refused here rather than falling back to the system's CAs.
func newBackendTLS(spec *v1alpha1.BackendTLSSpec, field string, log *slog.Logger) (*backendTLS, error) {
	b := &backendTLS{}
	if spec == nil {
		return b, nil
	}
	b.serverName = spec.ServerName
	if spec.CAFile != "" {
		ca, err := loadCABundle(spec.CAFile, log)
		if err != nil {
			return nil, fmt.Errorf("%s.caFile: %w", field, err)
		}
		b.ca = ca
	}
	if spec.CertFile != "" {
		b.client = &certs.Files{CertFile: spec.CertFile, KeyFile: spec.KeyFile, Log: log}
		if err := b.client.Load(); err != nil {
			return nil, fmt.Errorf("%s.certFile: %w", field, err)
		}
	}
	return b, nil
}

// backendTLSOf loads the backend TLS of every https scheduler that is not
// kept from prev, by name, before Apply changes anything: a CA file that
// fails refuses the configuration as a whole.
func (g *Router) backendTLSOf(schedulers []v1alpha1.SchedulerSpec, prev map[string]*scheduler) (map[string]*backendTLS, error) {
	out := map[string]*backendTLS{}
	for i, sc := range schedulers {
		if old := prev[sc.Name]; !sc.HTTPS() || old != nil && sameSettings(old.spec, sc) {
			continue
		}
		bt, err := newBackendTLS(sc.BackendTLS, fmt.Sprintf("spec.schedulers[%d].backendTLS", i), g.log.With("scheduler", sc.Name))
		if err != nil {
			return nil, fmt.Errorf("scheduler %s: %w", sc.Name, err)
		}
		out[sc.Name] = bt
	}
	return out, nil
}

// ClientConfig is the configuration of one new connection to addr (host:port).
// The caller may set NextProtos on it: it is its own.
func (b *backendTLS) ClientConfig(addr string) *tls.Config {
	name := b.serverName
	if name == "" {
		name = addr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			name = host
		}
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if b.ca != nil {
		c.RootCAs = b.ca.pool()
	}
	if b.client != nil {
		c.GetClientCertificate = b.clientCertificate
	}
	return c
}

// clientCertificate is tls.Config.GetClientCertificate: the current client
// certificate, its files looked at again if they may have changed. It is
// presented whatever CAs the server names, as curl and Envoy do: the server
// is the judge.
func (b *backendTLS) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	b.client.Check()
	return b.client.Certificate(), nil
}

// dialTLS connects to addr and completes the handshake within the connect
// timeout, offering h2 and HTTP/1.1. A failure says the server name checked;
// the caller logs it with the endpoint, clients never see it.
func (b *backendTLS) dialTLS(d *net.Dialer, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := b.ClientConfig(addr)
		cfg.NextProtos = []string{"h2", "http/1.1"}
		c := tls.Client(raw, cfg)
		if err := c.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("TLS handshake (server name %q): %w", cfg.ServerName, err)
		}
		return c, nil
	}
}

// caRecheck is how often, at most, a CA bundle file is read again to see
// whether it changed (only when a connection is being made).
const caRecheck = time.Second

// maxCABundle bounds the size of a CA bundle file.
const maxCABundle = 4 << 20

// caBundle is a PEM file of CA certificates that may be replaced while kvgate
// runs (a ConfigMap or Secret mounted as a volume). A replacement that cannot
// be read or parsed keeps the last good pool, and is logged.
type caBundle struct {
	path string
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	current *x509.CertPool
	data    []byte    // the file's content the last time it was read
	checked time.Time // when it was last read
	failed  string    // the last reload failure logged, so that it is logged once
}

func loadCABundle(path string, log *slog.Logger) (*caBundle, error) {
	data, err := readCAFile(path)
	if err != nil {
		return nil, err
	}
	pool, _, err := parseCABundle(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &caBundle{path: path, log: log, now: time.Now, current: pool, data: data, checked: time.Now()}, nil
}

// pool is the bundle's current CA pool, read again from the file when
// caRecheck has passed since it last was.
func (c *caBundle) pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if now.Sub(c.checked) < caRecheck {
		return c.current
	}
	c.checked = now
	data, err := readCAFile(c.path)
	if err == nil && bytes.Equal(data, c.data) {
		return c.current
	}
	var pool *x509.CertPool
	n := 0
	if err == nil {
		if pool, n, err = parseCABundle(data); err != nil {
			err = fmt.Errorf("%s: %w", c.path, err)
		}
	}
	if err != nil {
		if msg := err.Error(); msg != c.failed {
			c.failed = msg
			c.log.Error("backend CA bundle not reloaded; the last good one stays in use", "err", err)
		}
		return c.current
	}
	c.current, c.data, c.failed = pool, data, ""
	c.log.Info("backend CA bundle reloaded", "file", c.path, "certificates", n)
	return c.current
}

func readCAFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxCABundle+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxCABundle {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxCABundle)
	}
	return data, nil
}

// parseCABundle reads every CERTIFICATE block of a PEM bundle, and counts
// them; one that does
// not parse fails the bundle (AppendCertsFromPEM would skip it silently), as
// does a bundle without any. Text between blocks and other block types are
// ignored, as in the bundles distributions ship.
func parseCABundle(data []byte) (*x509.CertPool, int, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		n++
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, 0, fmt.Errorf("certificate %d: %w", n, err)
		}
		pool.AddCert(cert)
	}
	if n == 0 {
		return nil, 0, errors.New("no PEM certificate in the file")
	}
	return pool, n, nil
}

// Scheme is the URL scheme of the route's model servers: https when its
// scheduler's appProtocol is https, else http.
func (r *Route) Scheme() string {
	if r.p.spec.HTTPS() {
		return "https"
	}
	return "http"
}
