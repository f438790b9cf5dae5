package extproc

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/authtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestAuth: the picker authenticates as kvgate serve does, answering a refused
// request with an ImmediateResponse Envoy relays (401/403, WWW-Authenticate,
// an OpenAI error), and strips the credentials from what goes upstream.
func TestAuth(t *testing.T) {
	idp := authtest.New(t)
	addrs := startSims(t, 1, simserver.Options{})
	restricted := pool(addrs...)
	restricted.AllowedTenants = []string{"acme"}
	cfg := gatewayConfig(restricted)
	cfg.Spec.Auth = &v1alpha1.AuthSpec{
		APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey("sk-acme")}, {Tenant: "beta", Hash: auth.HashKey("sk-beta")}},
		JWT: &v1alpha1.JWTSpec{JWKSURI: idp.URL, Issuer: authtest.Issuer, Audiences: []string{authtest.Audience},
			RefreshInterval: &metav1.Duration{Duration: time.Second}},
	}
	s := startServer(t, cfg, Options{})
	bearer := func(cred string) map[string]string { return map[string]string{"authorization": "Bearer " + cred} }
	play := func(t *testing.T, h map[string]string) *played {
		t.Helper()
		return s.play(t, request{body: chatBody(llama, "hi"), headers: h})
	}
	for _, tc := range []struct {
		name      string
		headers   map[string]string
		status    int // 0: routed
		challenge string
	}{
		{"api key", bearer("sk-acme"), 0, ""},
		{"azure api-key header", map[string]string{"api-key": "sk-acme"}, 0, ""},
		{"jwt", bearer(idp.Token(t, "acme", nil)), 0, ""},
		{"no credentials", nil, 401, `Bearer realm="kvgate"`},
		{"revoked or unknown key", bearer("sk-gone"), 401, `error="invalid_token"`},
		{"expired jwt", bearer(idp.Token(t, "acme", jwt.MapClaims{"exp": time.Now().Add(-time.Hour).Unix()})), 401, `error="invalid_token"`},
		{"jwt for another audience", bearer(idp.Token(t, "acme", jwt.MapClaims{"aud": "other"})), 401, `error="invalid_token"`},
		{"jwt of an unknown kid", bearer(idp.Stranger(t, "acme")), 401, `error="invalid_token"`},
		{"tenant kept off the pool", bearer("sk-beta"), 404, ""},
		{"jwt tenant kept off the pool", bearer(idp.Token(t, "beta", nil)), 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := play(t, tc.headers)
			if tc.status == 0 {
				if dest := p.destination(t); dest[0] != addrs[0] {
					t.Fatalf("destination %v", dest)
				}
				removed := p.headers.GetHeaderMutation().GetRemoveHeaders()
				for name := range tc.headers {
					if !slices.Contains(removed, name) {
						t.Errorf("credential header %s not stripped (removed: %v)", name, removed)
					}
				}
				return
			}
			ir := p.immediate
			if ir == nil || int(ir.GetStatus().GetCode()) != tc.status {
				t.Fatalf("want an immediate %d, got %v (headers response %v)", tc.status, ir, p.headers)
			}
			if ch, _ := mutationValue(ir.GetHeaders(), "www-authenticate"); !strings.Contains(ch, tc.challenge) || (tc.status == 401) != (ch != "") {
				t.Errorf("www-authenticate %q", ch)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Code != tc.status || strings.Contains(string(ir.GetBody()), "sk-") {
				t.Errorf("body %s", ir.GetBody())
			}
		})
	}
	t.Run("rotated signing key", func(t *testing.T) {
		idp.Rotate(t, false)
		fresh := idp.Token(t, "acme", nil)
		waittest.Until(t, 10*time.Second, "a token of the new key routed", func() bool {
			return play(t, bearer(fresh)).immediate == nil
		})
	})
	s.inFlightZero(t)
}
