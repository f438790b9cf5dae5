package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// trust is a ClientTLS checking certificates against one CA for name.
type trust struct {
	pool *x509.CertPool
	name string
}

func trustCA(ca *simtest.CA, name string) *trust {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return &trust{pool: p, name: name}
}

func (c *trust) ClientConfig(string) *tls.Config {
	return &tls.Config{RootCAs: c.pool, ServerName: c.name, MinVersion: tls.VersionTLS12}
}

// TestScrapeOverTLS: a target with TLS is scraped over it when the server's
// certificate checks out; a certificate refused, a name it does not carry and
// a server that does not speak TLS fail the scrapes with the reason, as an
// endpoint that answers (not unreachable); a plain scrape of a TLS server
// fails until a Sync gives it TLS, when the same scraper dials anew.
func TestScrapeOverTLS(t *testing.T) {
	ca := simtest.NewCA(t, "models")
	cert := ca.Issue(t, "127.0.0.1", "vllm.models.svc")
	srv := simtest.Start(t, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 4000},
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	plain := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b"})
	for _, tc := range []struct {
		name    string
		addr    string
		tls     ClientTLS
		healthy bool
		reason  string // in LastError when not healthy
	}{
		{"the CA, the IP address", srv.Addr(), trustCA(ca, "127.0.0.1"), true, ""},
		{"the CA, the service name", srv.Addr(), trustCA(ca, "vllm.models.svc"), true, ""},
		{"another CA", srv.Addr(), trustCA(simtest.NewCA(t, "other"), "127.0.0.1"), false, "certificate signed by unknown authority"},
		{"a name not in the certificate", srv.Addr(), trustCA(ca, "sglang.models.svc"), false, "not sglang.models.svc"},
		{"a plain-HTTP server", plain.Addr(), trustCA(ca, "127.0.0.1"), false, "does not look like a TLS handshake"},
		{"plain HTTP to a TLS server", srv.Addr(), nil, false, "answered 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New(Config{Interval: 10 * time.Millisecond, Timeout: 2 * time.Second})
			defer f.Close()
			f.Sync(context.Background(), []Target{{Addr: tc.addr, TLS: tc.tls}})
			snap := func() Snapshot { return f.Snapshot([]string{tc.addr})[0] }
			if tc.healthy {
				waittest.Until(t, 10*time.Second, "a scrape over TLS", func() bool { return snap().Healthy })
				if g := snap(); g.NumBlocks != 4000 || g.Dialect != "vllm" {
					t.Errorf("metrics read over TLS: %+v", g)
				}
				return
			}
			waittest.Until(t, 10*time.Second, "three failed scrapes", func() bool { return snap().Failures >= 3 })
			g := snap()
			if g.Healthy || g.Scraped || !strings.Contains(g.LastError, tc.reason) {
				t.Errorf("healthy %v, scraped %v, last error %q; want failing with %q", g.Healthy, g.Scraped, g.LastError, tc.reason)
			}
			if g.Unreachable && tc.tls != nil {
				t.Errorf("a server that answered the handshake reads as unreachable: %q", g.LastError)
			}
		})
	}

	t.Run("TLS given by a later Sync", func(t *testing.T) {
		f := New(Config{Interval: 10 * time.Millisecond, Timeout: 2 * time.Second})
		defer f.Close()
		f.Sync(context.Background(), []Target{{Addr: srv.Addr()}})
		snap := func() Snapshot { return f.Snapshot([]string{srv.Addr()})[0] }
		waittest.Until(t, 10*time.Second, "plain scrapes failing", func() bool { return snap().Failures >= 1 })
		f.Sync(context.Background(), []Target{{Addr: srv.Addr(), TLS: trustCA(ca, "127.0.0.1")}})
		waittest.Until(t, 10*time.Second, "scrapes over TLS", func() bool { return snap().Healthy })
		// And back: the connection over TLS is not reused for plain scrapes.
		f.Sync(context.Background(), []Target{{Addr: srv.Addr()}})
		waittest.Until(t, 10*time.Second, "plain scrapes failing again", func() bool { return !snap().Healthy })
	})
}
