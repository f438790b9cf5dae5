package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/route/routetest"
	"github.com/kvgate/kvgate/internal/simserver"
)

// TestRequestKeepsItsConfiguration: a reload lands right after a request
// took its configuration, before authentication, the body limit, the body
// rules, the pick and the forwarding; the request is served wholly under the
// configuration it started with.
func TestRequestKeepsItsConfiguration(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	var sawCredentials atomic.Bool
	// b answers everything and remembers whether credentials reached it.
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		sawCredentials.Store(r.Header.Get("Authorization") != "")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"b","object":"chat.completion","choices":[]}`))
	}))
	t.Cleanup(b.Close)
	small := int64(4096)
	first := gatewayConfig(scheduler("p", llama, a))
	first.Spec.BBR.MaxRequestBodyBytes = &small
	first.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "a", Hash: auth.HashKey("key-a")}}}
	// The other one differs in every rule: no auth, a larger limit, another
	// endpoint, nothing exposed.
	other := gatewayConfig(scheduler("p", llama, strings.TrimPrefix(b.URL, "http://")))
	other.Spec.Gateway.Diagnostics = nil

	core := route.New(route.Options{Logger: quiet})
	t.Cleanup(core.Close)
	if err := core.Apply(first); err != nil {
		t.Fatal(err)
	}
	r := &routetest.Reloading{Router: core, Next: func(n int) *v1alpha1.InferenceGatewayConfig {
		if n%2 == 1 {
			return other
		}
		return first
	}}
	srv := httptest.NewServer(New(r, Options{Logger: quiet}))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name, key, body string
		status          int
	}{
		{"served by the first configuration's endpoint", "key-a", chat(llama), http.StatusOK},
		{"the first configuration's body limit", "key-a", chat(llama, `"user":"`+strings.Repeat("x", 5000)+`"`), http.StatusRequestEntityTooLarge},
		{"the first configuration's credentials", "", chat(llama), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each request starts under the first configuration.
			if err := core.Apply(first); err != nil {
				t.Fatal(err)
			}
			r.Taken.Store(0)
			h := []string{"Content-Type", "application/json"}
			if tc.key != "" {
				h = append(h, "Authorization", "Bearer "+tc.key)
			}
			resp, _, e := call(t, http.MethodPost, srv.URL+"/v1/chat/completions", tc.body, h...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, e.Error.Message, tc.status)
			}
			if n := r.Taken.Load(); n != 1 {
				t.Fatalf("the request took %d configurations, want 1", n)
			}
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
			if tc.status == http.StatusOK {
				if got := resp.Header.Get("X-Kvgate-Endpoint"); got != a {
					t.Errorf("served by %q, want the first configuration's %s (exposed by it)", got, a)
				}
			}
		})
	}
	if sawCredentials.Load() {
		t.Error("the later configuration's endpoint saw the client's credentials")
	}
}
