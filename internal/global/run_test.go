package global

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestRun: the router as `kvgate global` runs it — listeners, heartbeats,
// authentication built from the configuration, metrics and readiness on the
// admin listener, and a drain that returns once its context ends.
func TestRun(t *testing.T) {
	m := startTier1(t, 1, simserver.Options{})
	cfg := routerConfig(steadyRouting(), m.member("only", 1))
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey("sk-acme")}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api, admin, done := runRouter(t, ctx, ServerOptions{Config: cfg})
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waittest.Until(t, 10*time.Second, "ready once the member's heartbeat came", func() bool { code, _ := get(admin + "/readyz"); return code == 200 })
	// Ready means a member is healthy; a request also needs its summary to list
	// a ready endpoint for the model, which the member learns from its first scrape.
	waittest.Until(t, 10*time.Second, "the member's endpoint ready", func() bool {
		_, body := get(admin + "/debug/members")
		return strings.Contains(body, `"readyEndpoints": 1`)
	})
	if resp, body := send(t, api, "", chatBody("")); resp.StatusCode != 401 {
		t.Fatalf("without a key: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(t, api, "sk-acme", chatBody("")); resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Member") != "only" {
		t.Fatalf("with a key: %d %s", resp.StatusCode, body)
	}
	if _, body := get(admin + "/metrics"); !strings.Contains(body, `kvgate_global_requests_total{code="200",member="only"`) ||
		!strings.Contains(body, `kvgate_auth_requests_total{method="api_key",result="ok"} 1`) {
		t.Errorf("metrics lack the request or the authentication:\n%.3000s", body)
	}
	if _, body := get(admin + "/debug/members"); !strings.Contains(body, `"Healthy": true`) {
		t.Errorf("/debug/members: %.500s", body)
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

// runRouter runs the router as the command does, on loopback listeners, and
// returns its API and admin URLs and the channel Run's result arrives on.
func runRouter(t *testing.T, ctx context.Context, o ServerOptions) (api, admin string, done <-chan error) {
	t.Helper()
	o.Listen, o.AdminListen, o.DrainTimeout, o.Router.Logger = "127.0.0.1:0", "127.0.0.1:0", 5*time.Second, quiet
	ready := make(chan [2]string, 1)
	result := make(chan error, 1)
	o.Ready = ready
	go func() { result <- Run(ctx, o) }()
	select {
	case addrs := <-ready:
		return "http://" + addrs[0], "http://" + addrs[1], result
	case err := <-result:
		t.Fatal(err)
	}
	return "", "", nil
}
