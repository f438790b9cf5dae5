package extproc

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestScrapesOverTLS: under kvgate epp, Envoy makes the requests but the
// picker reads the model servers' metrics itself, over TLS when the
// scheduler says appProtocol https: endpoints whose certificates check out
// are scraped and the picker is ready; with another CA they are not, and
// /debug/fleet says why.
func TestScrapesOverTLS(t *testing.T) {
	ca := simtest.NewCA(t, "models")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := startSims(t, 2, simserver.Options{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "vllm.models.svc")}}})
	sc := pool(addrs...)
	sc.AppProtocol = v1alpha1.AppProtocolHTTPS
	sc.BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: "vllm.models.svc"}
	s := startServer(t, gatewayConfig(sc), Options{}) // returns once every endpoint is scraped healthy
	if !s.gw.Ready() {
		t.Error("scraped over TLS, and the picker is not ready")
	}
	for _, p := range s.gw.FleetView() {
		for _, e := range p.Endpoints {
			if e.Dialect != "vllm" || !e.Healthy {
				t.Errorf("%s: %+v", e.Address, e)
			}
		}
	}

	other := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(other, simtest.NewCA(t, "other").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	sc.BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: other, ServerName: "vllm.models.svc"} // a new one: the applied one is the router's
	if err := s.gw.Apply(gatewayConfig(sc)); err != nil {
		t.Fatal(err)
	}
	// The same addresses keep their scrapers, which dial anew with the new check.
	waittest.Until(t, 10*time.Second, "scrapes refused by the other CA", func() bool {
		for _, p := range s.gw.FleetView() {
			for _, e := range p.Endpoints {
				if e.Healthy || !strings.Contains(e.LastError, "certificate signed by unknown authority") {
					return false
				}
			}
		}
		return !s.gw.Ready()
	})
}
