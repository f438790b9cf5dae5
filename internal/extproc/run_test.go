package extproc

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestRun: `kvgate epp` as wired by Run — gRPC health reports not serving until
// the configuration brings endpoints (liveness always serving), the ext_proc
// service picks on its own port, metrics are on the admin port, and a cancelled
// context drains and returns.
//
// The ext_proc service runs over TLS with a self-signed certificate
// (--secure-serving), as gateways that dial the picker with TLS expect.
func TestRun(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	tlsConfig, err := TLSConfig("")
	if err != nil {
		t.Fatal(err)
	}
	apply := make(chan struct{})
	ready := make(chan host.Addrs, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, host.Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second, Logger: quiet, Ready: ready,
			Source: func(ctx context.Context, g *host.Host) error {
				select {
				case <-apply:
				case <-ctx.Done():
					return nil
				}
				if err := g.Apply(gatewayConfig(pool(addrs...))); err != nil {
					return err
				}
				<-ctx.Done()
				return nil
			}}, "127.0.0.1:0", tlsConfig, Options{Fallbacks: 0})
	}()
	var a host.Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	hc, err := grpc.NewClient(a.Health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hc.Close() }()
	health := healthpb.NewHealthClient(hc)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health %q: %v", service, err)
		}
		return r.GetStatus()
	}
	time.Sleep(300 * time.Millisecond) // several readiness updates
	for _, svc := range []string{"", HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		if st := check(svc); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q is %v before any endpoint is known", svc, st)
		}
	}
	if st := check(HealthLiveness); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness %v", st)
	}
	close(apply)
	waittest.Until(t, 10*time.Second, "readiness once endpoints are known", func() bool { return check(HealthReadiness) == healthpb.HealthCheckResponse_SERVING })

	if plain, err := grpc.NewClient(a.API, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		_, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{})
		_ = plain.Close()
		if err == nil {
			t.Fatal("the TLS listener answered a plaintext client")
		}
	}
	// As Envoy AI Gateway dials it: TLS, certificate not verified.
	conn, err := grpc.NewClient(a.API, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	s := &testServer{client: extprocv3.NewExternalProcessorClient(conn)}
	p := s.play(t, request{body: chatBody(llama, "hi")})
	if dest := p.destination(t); len(dest) != 1 || p.status != 200 {
		t.Fatalf("destination %v (--fallbacks 0 gives one address), status %d", dest, p.status)
	}
	resp, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `kvgate_extproc_streams_total{outcome="routed"} 1`) {
		t.Fatalf("metrics lack the routed stream:\n%.2000s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
