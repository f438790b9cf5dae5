package extproc

import (
	"context"
	"crypto/tls"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/certs"
	"github.com/kvgate/kvgate/internal/certs/certstest"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestServingTLSRotation: the ext_proc listener's certificate from
// --cert-path is reread when the files are replaced: new connections get the
// new one, an open gRPC connection goes on, a broken replacement keeps the
// certificate serving and is counted; files that do not load fail at start.
func TestServingTLSRotation(t *testing.T) {
	ca := certstest.NewCA(t, "ca")
	dir := t.TempDir()
	first, second := ca.Issue(t), ca.Issue(t)
	first.Write(t, dir)
	if _, err := ServingTLS(t.TempDir(), nil, nil); err == nil {
		t.Fatal("an empty --cert-path loaded")
	}
	reg := prometheus.NewRegistry()
	cfg, err := ServingTLS(dir, quiet, certs.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	addrs := startSims(t, 1, simserver.Options{})
	ready := make(chan host.Addrs, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, host.Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second, Logger: quiet, Ready: ready,
			Source: func(ctx context.Context, g *host.Host) error {
				if err := g.Apply(gatewayConfig(pool(addrs...))); err != nil {
					return err
				}
				<-ctx.Done()
				return nil
			}}, "127.0.0.1:0", cfg, Options{})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var a host.Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	client := &tls.Config{RootCAs: certstest.Pool(ca), ServerName: "localhost"}
	serial := func() string {
		c, err := tls.Dial("tcp", a.API, &tls.Config{RootCAs: client.RootCAs, ServerName: "localhost", NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	conn, err := grpc.NewClient(a.API, grpc.WithTransportCredentials(credentials.NewTLS(client)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	health := healthpb.NewHealthClient(conn)
	check := func() {
		t.Helper()
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: HealthLiveness}); err != nil {
			t.Fatalf("health over the open connection: %v", err)
		}
	}
	check()
	if got := serial(); got != first.Serial.String() {
		t.Fatalf("serving %s, want the first certificate %s", got, first.Serial)
	}
	second.Write(t, dir)
	waittest.Until(t, 10*time.Second, "new connections to get the rotated certificate", func() bool { return serial() == second.Serial.String() })
	check()
	failures := promtest.Value(t, reg, "kvgate_tls_certificate_reloads_total", "result", "failure")
	if err := os.WriteFile(dir+"/tls.key", []byte("broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the broken key to be counted", func() bool {
		_ = serial()
		return promtest.Value(t, reg, "kvgate_tls_certificate_reloads_total", "result", "failure") == failures+1
	})
	if got := serial(); got != second.Serial.String() {
		t.Fatalf("serving %s after a broken key, want %s", got, second.Serial)
	}
	check()
}
