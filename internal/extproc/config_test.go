package extproc

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/route/routetest"
	"github.com/kvgate/kvgate/internal/simserver"
)

// TestExchangeKeepsItsConfiguration: a reload lands right after an exchange
// took its configuration, before authentication, the body limit, the body
// rules, the pick and the header mutations; the exchange is answered wholly
// under the configuration it started with.
func TestExchangeKeepsItsConfiguration(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	small := int64(4096)
	first := gatewayConfig(pool(addrs[0]))
	first.Spec.BBR.MaxRequestBodyBytes = &small
	first.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "a", Hash: auth.HashKey("key-a")}}}
	// The other one differs in every rule: no auth, a larger limit, another
	// endpoint.
	other := gatewayConfig(pool(addrs[1]))

	core := route.New(route.Options{Logger: quiet})
	t.Cleanup(core.Close)
	r := &routetest.Reloading{Router: core, Next: func(n int) *v1alpha1.InferenceGatewayConfig {
		if n%2 == 1 {
			return other
		}
		return first
	}}
	s := serveCore(t, r, Options{Logger: quiet})
	key := map[string]string{"authorization": "Bearer key-a"}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		body    []byte
		status  int // 0: routed
	}{
		{"routed to the first configuration's endpoint, credentials stripped", key, chatBody(llama, "hi"), 0},
		{"the first configuration's body limit", key, chatBody(llama, strings.Repeat("x", 5000)), 413},
		{"the first configuration's credentials", nil, chatBody(llama, "hi"), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := core.Apply(first); err != nil {
				t.Fatal(err)
			}
			r.Taken.Store(0)
			p := s.play(t, request{body: tc.body, headers: tc.headers, noUpstream: tc.status == 0})
			if n := r.Taken.Load(); n != 1 {
				t.Fatalf("the exchange took %d configurations, want 1", n)
			}
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
			if tc.status != 0 {
				if ir := p.immediate; ir == nil || int(ir.GetStatus().GetCode()) != tc.status {
					t.Fatalf("want an immediate %d, got %v (headers response %v)", tc.status, ir, p.headers)
				}
				return
			}
			if dest := p.destination(t); dest[0] != addrs[0] {
				t.Fatalf("destination %v, want the first configuration's %s", dest, addrs[0])
			}
			if removed := p.headers.GetHeaderMutation().GetRemoveHeaders(); !slices.Contains(removed, "authorization") {
				t.Errorf("credentials not stripped under the configuration that authenticated them (removed: %v)", removed)
			}
		})
	}
}
