package host_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestSummary: the load summary counts the window's requests and errors per
// scheduler, reads a TTFT quantile from them, and sees the ready endpoints.
func TestSummary(t *testing.T) {
	a := startSim(t, llama, simserver.Options{}).Addr()
	g := start(t, config(scheduler("llama", llama, a), scheduler("qwen", qwen, "127.0.0.1:1")), host.CoreOptions{})
	waittest.Until(t, 5*time.Second, "the endpoint scraped", func() bool { return g.Router().Snapshot([]string{a})[0].Scraped })
	for range 5 {
		post(t, g.URL, chat(llama, 4, true)) // streamed: their first bytes are TTFTs
	}
	// Nothing listens: 502, an error in OpenAI's shape.
	status, _, body := send(t, http.MethodPost, g.URL+"/v1/chat/completions", chat(qwen, 4, false))
	var e struct{ Error struct{ Message string } }
	if err := json.Unmarshal([]byte(body), &e); status == http.StatusOK || err != nil || e.Error.Message == "" {
		t.Fatalf("status %d with a body that is not an OpenAI error: %q", status, body)
	}
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/summary", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	var s route.Summary
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Models) != 2 {
		t.Fatalf("models %+v", s.Models)
	}
	l, q := s.Models[0], s.Models[1]
	if l.Model != llama || l.ReadyEndpoints != 1 || l.Endpoints != 1 || l.Requests != 5 || l.ErrorRate != 0 || l.TTFTSamples != 5 || l.TTFTP95Seconds <= 0 {
		t.Errorf("llama: %+v", l)
	}
	if q.Model != qwen || q.ReadyEndpoints != 0 || q.Requests != 1 || q.ErrorRate != 1 {
		t.Errorf("qwen: %+v", q)
	}
}

// TestReadyz: while one scheduler has no endpoint the fleet reads as healthy
// (its one pod stopped answering, scrapes included), /readyz passes naming it
// — the other models still serve — and /readyz?endpoints=all fails naming it.
func TestReadyz(t *testing.T) {
	bad := startSim(t, qwen, simserver.Options{})
	good := startSim(t, llama, simserver.Options{}).Addr()
	cfg := config(scheduler("p", llama, good), scheduler("frozen", qwen, bad.Addr()))
	// Fast scrapes: the pod is found gone within the test's patience.
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	three := int32(3)
	cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{Interval: d(20 * time.Millisecond), Timeout: d(100 * time.Millisecond), UnhealthyAfter: &three}
	g := start(t, cfg, host.CoreOptions{})
	readyz := func(query string) (int, string) {
		status, _, body := send(t, http.MethodGet, g.AdminURL+"/readyz"+query, "")
		return status, body
	}
	waittest.Until(t, 10*time.Second, "every endpoint read healthy", func() bool {
		for _, s := range g.Router().Snapshot([]string{bad.Addr(), good}) {
			if !s.Healthy || s.Stale {
				return false
			}
		}
		return true
	})
	if code, body := readyz("?endpoints=all"); code != 200 {
		t.Fatalf("both schedulers ready: %d %s", code, body)
	}
	if err := bad.SetFaults(simserver.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := readyz("?endpoints=all")
		if code == 503 && strings.Contains(body, "no ready endpoint for scheduler frozen") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a frozen scheduler: /readyz?endpoints=all %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := readyz(""); code != 200 || !strings.Contains(body, "no ready endpoint for scheduler frozen") {
		t.Errorf("a frozen scheduler: /readyz %d %q, want 200 naming it", code, body)
	}
}

// TestDebugConfigHoldsNoSecret: /debug/config shows the configuration without
// the JWKS URL's password or query values, without the API keys' hashes and
// without kubectl's copy of the spec in the annotations.
func TestDebugConfigHoldsNoSecret(t *testing.T) {
	const (
		password = "s3cretpass"
		query    = "sig0123"
		hash     = "sha256:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
	)
	cfg := config(scheduler("chat", llama, "127.0.0.1:1"))
	cfg.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"hash":"` + hash + `"}`}
	cfg.Spec.Auth = &v1alpha1.AuthSpec{
		JWT:     &v1alpha1.JWTSpec{JWKSURI: "https://reader:" + password + "@127.0.0.1:1/jwks?token=" + query},
		APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: hash}},
	}
	g := start(t, cfg, host.CoreOptions{})
	d := readDebugConfig(t, strings.TrimPrefix(g.AdminURL, "http://"))
	if !strings.Contains(d.Active, "tenant: acme") || !strings.Contains(d.Active, "https://reader:xxxxx@127.0.0.1:1/jwks?token=xxxxx") {
		t.Fatalf("the configuration is not shown redacted:\n%s", d.Active)
	}
	for _, secret := range []string{password, query, hash[len("sha256:"):]} {
		if strings.Contains(d.Active, secret) {
			t.Errorf("/debug/config shows %q:\n%s", secret, d.Active)
		}
	}
}
