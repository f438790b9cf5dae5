package route

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
)

func httpsScheduler(caFile, serverName string, endpoints ...string) v1alpha1.SchedulerSpec {
	sc := schedulerSpec("s", llama, endpoints...)
	sc.AppProtocol = v1alpha1.AppProtocolHTTPS
	if caFile != "" || serverName != "" {
		sc.BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: serverName}
	}
	return sc
}

// TestApplyRefusesBadCAFile: a CA bundle that cannot be read or holds no
// good certificate refuses the configuration with an error naming the field;
// the previous configuration keeps serving. No fallback to the system's CAs.
func TestApplyRefusesBadCAFile(t *testing.T) {
	dir := t.TempDir()
	ca := simtest.NewCA(t, "models")
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("ca.pem", ca.PEM)
	corrupt := bytes.Replace(ca.PEM, []byte("\n"), []byte("\nAAAA"), 3) // still PEM, no longer DER
	for _, tc := range []struct {
		name, file, want string
	}{
		{"missing", filepath.Join(dir, "none.pem"), "no such file"},
		{"a directory", dir, "is a directory"},
		{"empty", write("empty.pem", nil), "no PEM certificate"},
		{"a key, no certificate", write("key.pem", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")), "no PEM certificate"},
		{"a corrupt certificate", write("corrupt.pem", append(append([]byte{}, ca.PEM...), corrupt...)), "certificate 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true}})
			defer g.Close()
			prev := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{httpsScheduler(good, "", "10.0.0.1:8000")}}}
			if err := g.Apply(prev); err != nil {
				t.Fatal(err)
			}
			// A scheduler added before the one refused leaves no trace either.
			bad := prev.DeepCopy()
			bad.Spec.BBR.Enabled = true
			bad.Spec.Schedulers[0].BackendTLS.CAFile = tc.file
			bad.Spec.Schedulers = append([]v1alpha1.SchedulerSpec{schedulerSpec("t", "other", "10.0.0.9:8000")}, bad.Spec.Schedulers...)
			err := g.Apply(bad)
			if err == nil || !strings.Contains(err.Error(), "spec.schedulers[1].backendTLS.caFile") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply: %v; want the field named and %q", err, tc.want)
			}
			if got := g.routes.Load(); got.cfg != prev || got.schedulers[0].tls.ca.path != good {
				t.Errorf("the previous configuration no longer serves")
			}
			if len(g.endpoints) != 1 {
				t.Errorf("endpoints of the refused configuration kept: %d, want 1", len(g.endpoints))
			}
		})
	}

	t.Run("accepted and kept across endpoint changes", func(t *testing.T) {
		g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true}})
		defer g.Close()
		for _, tc := range []struct {
			sc     v1alpha1.SchedulerSpec
			keep   bool
			withCA bool
		}{
			{httpsScheduler("", "", "10.0.0.1:8000"), false, false},
			{httpsScheduler(good, "vllm.models.svc", "10.0.0.1:8000"), false, true},
			{httpsScheduler(good, "vllm.models.svc", "10.0.0.1:8000", "10.0.0.2:8000"), true, true},
		} {
			before := g.routes.Load()
			cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{tc.sc}}}
			if err := g.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			p := g.routes.Load().schedulers[0]
			if p.tls == nil || (p.tls.ca != nil) != tc.withCA || p.transport.DialTLSContext == nil || !p.transport.ForceAttemptHTTP2 {
				t.Fatalf("scheduler %+v: TLS %+v", tc.sc, p.tls)
			}
			if kept := before != nil && before.schedulers[0].tls == p.tls; kept != tc.keep {
				t.Errorf("TLS kept %v, want %v", kept, tc.keep)
			}
		}
	})
}

// TestCABundleRotation: the bundle is read again once caRecheck has passed;
// a new CA applies from then on, and a replacement that does not parse or a
// file gone keeps the last good pool, logged once.
func TestCABundleRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.pem")
	first, second := simtest.NewCA(t, "first"), simtest.NewCA(t, "second")
	leafOf := func(ca *simtest.CA) *x509.Certificate { return ca.Issue(t, "vllm.models.svc").Leaf }
	simtest.WriteFile(t, path, first.PEM)
	var logs bytes.Buffer
	b, err := loadCABundle(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.now = func() time.Time { return now }
	verifies := func(leaf *x509.Certificate) bool {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: b.pool(), DNSName: "vllm.models.svc"})
		return err == nil
	}
	for _, tc := range []struct {
		name          string
		step          func()
		first, second bool
		logged        string
	}{
		{"loaded", func() {}, true, false, ""},
		{"replaced, not yet reread", func() { simtest.WriteFile(t, path, second.PEM) }, true, false, ""},
		{"reread", func() { now = now.Add(caRecheck) }, false, true, "backend CA bundle reloaded"},
		{"both during a rotation", func() {
			simtest.WriteFile(t, path, append(append([]byte{}, first.PEM...), second.PEM...))
			now = now.Add(caRecheck)
		}, true, true, "certificates=2"},
		{"garbage keeps the last good", func() { simtest.WriteFile(t, path, []byte("oops")); now = now.Add(caRecheck) }, true, true, "no PEM certificate"},
		{"garbage again, not logged again", func() { now = now.Add(caRecheck) }, true, true, ""},
		{"gone keeps the last good", func() { _ = os.Remove(path); now = now.Add(caRecheck) }, true, true, "no such file"},
		{"back", func() { simtest.WriteFile(t, path, second.PEM); now = now.Add(caRecheck) }, false, true, "reloaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			tc.step()
			if f, s := verifies(leafOf(first)), verifies(leafOf(second)); f != tc.first || s != tc.second {
				t.Errorf("first CA's certificate verifies %v, second's %v; want %v, %v", f, s, tc.first, tc.second)
			}
			if got := logs.String(); tc.logged == "" && got != "" || !strings.Contains(got, tc.logged) {
				t.Errorf("logged %q, want %q", got, tc.logged)
			}
		})
	}
}

// TestBackendTLSDial: the transport of an https scheduler checks the
// certificate against the bundle for the configured server name, else the
// endpoint's IP address, and speaks h2 when the server offers it by ALPN,
// else HTTP/1.1; a refusal is an error saying why.
func TestBackendTLSDial(t *testing.T) {
	dir := t.TempDir()
	ca := simtest.NewCA(t, "models")
	caFile := filepath.Join(dir, "ca.pem")
	simtest.WriteFile(t, caFile, ca.PEM)
	dnsOnly := simtest.Start(t, simserver.Options{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "vllm.models.svc")}}})
	ipSAN := simtest.Start(t, simserver.Options{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}}})
	plain := simtest.Start(t, simserver.Options{})
	// A server that speaks HTTP/1.1 only over TLS (httptest offers no h2 unless asked).
	h1 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"data":[]}`)) }))
	h1.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "vllm.models.svc")}}
	h1.StartTLS()
	defer h1.Close()
	h1Addr := strings.TrimPrefix(h1.URL, "https://")
	for _, tc := range []struct {
		name       string
		addr       string
		caFile     string
		serverName string
		want       string // "" succeeds
		major      int    // the HTTP version it succeeds with
	}{
		{"service name configured", dnsOnly.Addr(), caFile, "vllm.models.svc", "", 2},
		{"IP address by default", ipSAN.Addr(), caFile, "", "", 2},
		{"HTTP/1.1 when the server offers no h2", h1Addr, caFile, "vllm.models.svc", "", 1},
		{"IP address not in the certificate", dnsOnly.Addr(), caFile, "", "doesn't contain any IP SANs", 0},
		{"another name", dnsOnly.Addr(), caFile, "sglang.models.svc", "not sglang.models.svc", 0},
		{"system CAs", ipSAN.Addr(), "", "", "certificate signed by unknown authority", 0},
		{"plain HTTP server", plain.Addr(), caFile, "", "does not look like a TLS handshake", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bt, err := newBackendTLS(&v1alpha1.BackendTLSSpec{CAFile: tc.caFile, ServerName: tc.serverName}, "backendTLS", slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			tr := newTransport(v1alpha1.GatewaySpec{}, false, bt)
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+tc.addr+"/v1/models", nil)
			resp, err := tr.RoundTrip(req)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.ProtoMajor != tc.major {
					t.Errorf("%s over HTTP/%d; want 200 over HTTP/%d", resp.Status, resp.ProtoMajor, tc.major)
				}
				return
			}
			if err == nil {
				_ = resp.Body.Close()
				t.Fatalf("answered %s; want refused with %q", resp.Status, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q; want %q", err, tc.want)
			}
		})
	}
}

func TestClientConfigServerName(t *testing.T) {
	for _, tc := range []struct{ addr, configured, want string }{
		{"10.1.2.3:8000", "", "10.1.2.3"},
		{"[fd00::1]:8000", "", "fd00::1"},
		{"vllm-0.vllm:8000", "", "vllm-0.vllm"},
		{"10.1.2.3:8000", "vllm.models.svc", "vllm.models.svc"},
	} {
		t.Run(tc.addr+" "+tc.configured, func(t *testing.T) {
			c := (&backendTLS{serverName: tc.configured}).ClientConfig(tc.addr)
			if c.ServerName != tc.want || c.MinVersion != tls.VersionTLS12 || c.InsecureSkipVerify || c.RootCAs != nil {
				t.Errorf("server name %q, min version %x; want %q, TLS 1.2, the system's CAs", c.ServerName, c.MinVersion, tc.want)
			}
		})
	}
}

// TestBackendTLSClientCertificate: a client certificate that does not load
// refuses the configuration naming the field, as a bad CA bundle does; one
// that loads is what handshakes present.
func TestBackendTLSClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := simtest.NewCA(t, "clients")
	certFile, keyFile := ca.IssueClient(t, "kvgate").Write(t, dir)
	other := ca.IssueClient(t, "other")
	otherKey := filepath.Join(dir, "other.key")
	simtest.WriteFile(t, otherKey, other.KeyPEM)
	for _, tc := range []struct {
		name, cert, key, want string // want "" loads
	}{
		{"loads", certFile, keyFile, ""},
		{"certificate missing", filepath.Join(dir, "none.crt"), keyFile, "no such file"},
		{"key missing", certFile, filepath.Join(dir, "none.key"), "no such file"},
		{"key of another certificate", certFile, otherKey, "private key does not match public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bt, err := newBackendTLS(&v1alpha1.BackendTLSSpec{CertFile: tc.cert, KeyFile: tc.key}, "spec.schedulers[0].backendTLS", slog.New(slog.DiscardHandler))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), "spec.schedulers[0].backendTLS.certFile") || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("newBackendTLS: %v; want the field named and %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := bt.ClientConfig("10.0.0.1:8443").GetClientCertificate(&tls.CertificateRequestInfo{})
			if err != nil || c == nil || c.Leaf.Subject.CommonName != "kvgate" {
				t.Fatalf("client certificate %+v, %v", c, err)
			}
		})
	}
}
