package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// mtlsServer is a model server over TLS that requires a client certificate
// signed by the CA it trusts now (swappable), and remembers the serial of
// the last one it accepted.
type mtlsServer struct {
	*simserver.Server
	addr    string
	trusted atomic.Pointer[x509.CertPool]
	serial  atomic.Pointer[string]
}

func startMTLS(t *testing.T, model string, serverCA *simtest.CA, clientCA *simtest.CA) *mtlsServer {
	t.Helper()
	m := &mtlsServer{}
	m.trusted.Store(x509.NewCertPool())
	m.trusted.Load().AddCert(clientCA.Cert)
	base := &tls.Config{Certificates: []tls.Certificate{serverCA.Issue(t, "vllm.models.svc")}, ClientAuth: tls.RequireAndVerifyClientCert}
	m.Server, m.addr = startSim(t, model, simserver.Options{TLS: &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.ClientCAs = m.trusted.Load()
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				s := cs.PeerCertificates[0].SerialNumber.String()
				m.serial.Store(&s)
				return nil
			}
			return c, nil
		}}})
	return m
}

// reconnect makes the gateway open new connections, as a restart of the
// server does.
func (m *mtlsServer) reconnect(t *testing.T) {
	t.Helper()
	for _, f := range []simserver.Faults{{RefuseConnections: true}, {}} {
		if err := m.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
}

func (m *mtlsServer) lastSerial() string {
	if s := m.serial.Load(); s != nil {
		return *s
	}
	return ""
}

// TestBackendMTLS: model servers that require and verify client
// certificates serve kvgate when backendTLS names one, requests and scrapes
// alike; without one the client gets the usual OpenAI-shaped 503 with
// nothing of TLS or the address in it; a client certificate rotated in its
// files is presented from the next connection on, without a restart.
func TestBackendMTLS(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	serverCA, clientCA, rotatedCA := simtest.NewCA(t, "models"), simtest.NewCA(t, "clients"), simtest.NewCA(t, "clients-2")
	simtest.WriteFile(t, caFile, serverCA.PEM)
	first := clientCA.IssueClient(t, "kvgate")
	certFile, keyFile := first.Write(t, dir)

	withCert := startMTLS(t, llama, serverCA, clientCA)
	without := startMTLS(t, qwen, serverCA, clientCA)
	mtls := scheduler("llama", llama, withCert.addr)
	mtls.AppProtocol = v1alpha1.AppProtocolHTTPS
	mtls.BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: "vllm.models.svc", CertFile: certFile, KeyFile: keyFile}
	plain := scheduler("qwen", qwen, without.addr)
	plain.AppProtocol = v1alpha1.AppProtocolHTTPS
	plain.BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: "vllm.models.svc"}
	var logs logtest.Buffer
	g, base := startGateway(t, gatewayConfig(mtls, plain), func(s *setup) { s.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })

	healthy := func(addr string) bool {
		for _, s := range g.FleetView() {
			for _, e := range s.Endpoints {
				if e.Address == addr {
					return e.Scraped && e.Healthy && !e.Stale
				}
			}
		}
		return false
	}
	served := func(model string) (int, []byte) {
		resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(model))
		return resp.StatusCode, raw
	}
	refused := func(t *testing.T, model, addr string) {
		t.Helper()
		code, raw := served(model)
		if code != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"message":"no endpoint could serve the request; retry later (request id `) {
			t.Fatalf("%d %s; want the usual OpenAI-shaped 503", code, raw)
		}
		for _, leak := range []string{"x509", "tls", "TLS", "certificate", "handshake", addr} {
			if strings.Contains(string(raw), leak) {
				t.Errorf("the client's answer carries %q: %s", leak, raw)
			}
		}
	}

	t.Run("served with the client certificate", func(t *testing.T) {
		if code, raw := served(llama); code != http.StatusOK {
			t.Fatalf("%d %s", code, raw)
		}
		if got := withCert.lastSerial(); got != first.Serial.String() {
			t.Errorf("the server saw client certificate %q, want %s", got, first.Serial)
		}
		waittest.Until(t, 10*time.Second, "the endpoint scraped over mTLS", func() bool { return healthy(withCert.addr) })
	})

	t.Run("refused without one", func(t *testing.T) {
		refused(t, qwen, without.addr)
		if without.lastSerial() != "" || healthy(without.addr) {
			t.Error("the server accepted a connection without a client certificate")
		}
		refusedLogged(t, &logs, without.addr, "certificate required")
	})

	t.Run("a rotated client certificate is used without a restart", func(t *testing.T) {
		// The server now trusts only the new CA: the old certificate fails.
		withCert.trusted.Store(x509.NewCertPool())
		withCert.trusted.Load().AddCert(rotatedCA.Cert)
		withCert.reconnect(t)
		refused(t, llama, withCert.addr)
		next := rotatedCA.IssueClient(t, "kvgate")
		next.Write(t, dir)
		waittest.Until(t, 10*time.Second, "served again", func() bool { code, _ := served(llama); return code == http.StatusOK })
		if got := withCert.lastSerial(); got != next.Serial.String() {
			t.Errorf("the server saw client certificate %q, want the rotated %s", got, next.Serial)
		}
		if !strings.Contains(logs.String(), "TLS certificate reloaded") {
			t.Error("the rotation is not logged")
		}
	})
}
