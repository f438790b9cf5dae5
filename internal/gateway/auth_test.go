package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/authtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// sdkStatus is the HTTP status of an SDK call: 200 or the API error's.
func sdkStatus(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return http.StatusOK
	}
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("not an API error: %v", err)
	}
	return apiErr.StatusCode
}

func chatWith(t *testing.T, base, model string, opts ...option.RequestOption) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := sdk(base, opts...)
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(2)})
	return err
}

func TestAuthAPIKeys(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, qwen, simserver.Options{})
	restricted := scheduler("p", llama, a)
	restricted.AllowedTenants = []string{"acme"}
	cfg := gatewayConfig(restricted, scheduler("q", qwen, b))
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{
		{Tenant: "acme", Hash: auth.HashKey("sk-acme")}, {Tenant: "beta", Hash: "sha256:" + strings.ToUpper(strings.TrimPrefix(auth.HashKey("sk-beta"), "sha256:"))}}}
	g, base := startGateway(t, cfg)

	for _, tc := range []struct {
		name, key, model string
		want             int
	}{
		{"acme on its pool", "sk-acme", llama, 200},
		{"acme on the open pool", "sk-acme", qwen, 200},
		{"beta kept off the restricted pool, as if it did not exist", "sk-beta", llama, 404},
		{"beta on the open pool", "sk-beta", qwen, 200},
		{"unknown key", "sk-nobody", qwen, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sdkStatus(t, chatWith(t, base, tc.model, option.WithAPIKey(tc.key))); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}

	t.Run("refusals are OpenAI errors with a challenge", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			header    []string
			status    int
			challenge string
		}{
			{"none", nil, 401, `Bearer realm="kvgate"`},
			{"wrong", []string{"Authorization", "Bearer sk-nobody"}, 401, `Bearer realm="kvgate", error="invalid_token"`},
			{"basic", []string{"Authorization", "Basic YTpi"}, 401, `Bearer realm="kvgate", error="invalid_token"`},
			{"azure header", []string{"Api-Key", "sk-beta"}, 200, ""},
		} {
			resp, raw, e := call(t, "POST", base+"/v1/chat/completions", chat(qwen), tc.header...)
			if resp.StatusCode != tc.status || resp.Header.Get("WWW-Authenticate") != tc.challenge {
				t.Errorf("%s: %d %q %s", tc.name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), raw)
			}
			if tc.status == 401 && (e.Error.Type != "invalid_request_error" || strings.Contains(string(raw), "sk-")) {
				t.Errorf("%s: body %s", tc.name, raw)
			}
		}
		// Unknown paths and the model list are behind the door too.
		for _, path := range []string{"/v1/models", "/v1/nothing-here"} {
			if resp, _, _ := call(t, "GET", base+path, ""); resp.StatusCode != 401 {
				t.Errorf("GET %s without credentials: %d", path, resp.StatusCode)
			}
		}
	})

	t.Run("a tenant lists only the models it may use", func(t *testing.T) {
		ctx := context.Background()
		ids := func(key string) []string {
			c := sdk(base, option.WithAPIKey(key))
			page, err := c.Models.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, m := range page.Data {
				out = append(out, m.ID)
			}
			return out
		}
		if got := strings.Join(ids("sk-acme"), ","); got != llama+","+qwen {
			t.Errorf("acme sees %s", got)
		}
		if got := strings.Join(ids("sk-beta"), ","); got != qwen {
			t.Errorf("beta sees %s", got)
		}
		c := sdk(base, option.WithAPIKey("sk-beta"))
		_, err := c.Models.Get(ctx, llama)
		if s := sdkStatus(t, err); s != 404 {
			t.Errorf("beta retrieving the restricted model: %d", s)
		}
	})

	t.Run("revoked", func(t *testing.T) {
		next := cfg.DeepCopy()
		next.Spec.Auth.APIKeys = next.Spec.Auth.APIKeys[1:]
		if err := g.Apply(next); err != nil {
			t.Fatal(err)
		}
		if got := sdkStatus(t, chatWith(t, base, qwen, option.WithAPIKey("sk-acme"))); got != 401 {
			t.Errorf("revoked key: %d", got)
		}
		if got := sdkStatus(t, chatWith(t, base, qwen, option.WithAPIKey("sk-beta"))); got != 200 {
			t.Errorf("the key kept: %d", got)
		}
	})

	t.Run("health stays open on the admin listener", func(t *testing.T) {
		admin := httptest.NewServer(g.AdminHandler())
		defer admin.Close()
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get(admin.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d", path, resp.StatusCode)
			}
		}
	})
	if n := counter(t, g, "kvgate_auth_requests_total", "method", "api_key", "result", "unknown_key"); n < 2 {
		t.Errorf("unknown keys counted %v", n)
	}
}

// TestAuthCredentialsStayHere: the client's credentials were for the gateway,
// so the model server never sees them.
func TestAuthCredentialsStayHere(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[]}`))
	}))
	defer up.Close()
	cfg := gatewayConfig(scheduler("p", "m", strings.TrimPrefix(up.URL, "http://")))
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey("sk-acme")}}}
	_, base := startGateway(t, cfg)
	for _, h := range [][]string{{"Authorization", "Bearer sk-acme"}, {"Api-Key", "sk-acme"}} {
		if resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat("m"), h...); resp.StatusCode != 200 {
			t.Fatalf("%v: %d %s", h, resp.StatusCode, raw)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	for _, h := range seen {
		if h.Get("Authorization") != "" || h.Get("Api-Key") != "" {
			t.Errorf("credentials reached the model server: %v", h)
		}
	}
}

func TestAuthJWT(t *testing.T) {
	idp := authtest.New(t)
	_, a := startSim(t, llama, simserver.Options{})
	cfg := gatewayConfig(scheduler("p", llama, a))
	cfg.Spec.Auth = &v1alpha1.AuthSpec{JWT: &v1alpha1.JWTSpec{JWKSURI: idp.URL, Issuer: authtest.Issuer, Audiences: []string{authtest.Audience},
		RequiredClaims:  []v1alpha1.ClaimRequirement{{Name: "scope", Values: []string{"inference"}}},
		RefreshInterval: &metav1.Duration{Duration: time.Second}}}
	_, base := startGateway(t, cfg)
	scoped := jwt.MapClaims{"scope": "read inference"}
	for _, tc := range []struct {
		name      string
		token     string
		want      int
		challenge string
	}{
		{"valid", idp.Token(t, "acme", scoped), 200, ""},
		{"expired", idp.Token(t, "acme", jwt.MapClaims{"scope": "inference", "exp": time.Now().Add(-time.Hour).Unix()}), 401, `error="invalid_token"`},
		{"wrong audience", idp.Token(t, "acme", jwt.MapClaims{"scope": "inference", "aud": "someone-else"}), 401, `error="invalid_token"`},
		{"wrong issuer", idp.Token(t, "acme", jwt.MapClaims{"scope": "inference", "iss": "https://evil.test/"}), 401, `error="invalid_token"`},
		{"unknown kid", idp.Stranger(t, "acme"), 401, `error="invalid_token"`},
		{"without the required scope", idp.Token(t, "acme", jwt.MapClaims{"scope": "read"}), 403, `error="insufficient_scope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sdkStatus(t, chatWith(t, base, llama, option.WithAPIKey(tc.token))); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
			if tc.want != 200 {
				resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), "Authorization", "Bearer "+tc.token)
				if !strings.Contains(resp.Header.Get("WWW-Authenticate"), tc.challenge) || strings.Contains(string(raw), tc.token) {
					t.Errorf("%q %s", resp.Header.Get("WWW-Authenticate"), raw)
				}
			}
		})
	}
	t.Run("rotated key", func(t *testing.T) {
		old := idp.Token(t, "acme", scoped)
		idp.Rotate(t, false)
		fresh := idp.Token(t, "acme", scoped)
		// The JWKS is fetched again every refreshInterval (1s here).
		waittest.Until(t, 10*time.Second, "a token of the new key accepted", func() bool {
			return sdkStatus(t, chatWith(t, base, llama, option.WithAPIKey(fresh))) == 200
		})
		if got := sdkStatus(t, chatWith(t, base, llama, option.WithAPIKey(old))); got != 401 {
			t.Errorf("a token of the retired key: %d", got)
		}
	})
}

// TestDiagnostics: routing internals (the endpoint's address, every
// candidate's scores) reach a client only when the configuration says so.
func TestDiagnostics(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	keys := &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "ops", Hash: auth.HashKey("sk-ops")}, {Tenant: "acme", Hash: auth.HashKey("sk-acme")}}}
	for _, tc := range []struct {
		name   string
		diag   *v1alpha1.DiagnosticsSpec
		auth   *v1alpha1.AuthSpec
		key    string
		expose bool
	}{
		{"off by default", nil, nil, "", false},
		{"off when not exposed", &v1alpha1.DiagnosticsSpec{}, nil, "", false},
		{"on for everyone", &v1alpha1.DiagnosticsSpec{Expose: true}, nil, "", true},
		{"on for a listed tenant", &v1alpha1.DiagnosticsSpec{Expose: true, Tenants: []string{"ops"}}, keys, "sk-ops", true},
		{"off for another", &v1alpha1.DiagnosticsSpec{Expose: true, Tenants: []string{"ops"}}, keys, "sk-acme", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gatewayConfig(scheduler("p", llama, a))
			cfg.Spec.Gateway.Diagnostics, cfg.Spec.Auth = tc.diag, tc.auth
			_, base := startGateway(t, cfg)
			h := []string{"X-Kvgate-Explain", "1"}
			if tc.key != "" {
				h = append(h, "Authorization", "Bearer "+tc.key)
			}
			resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), h...)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
			ep, scores := resp.Header.Get("X-Kvgate-Endpoint"), resp.Header.Get("X-Kvgate-Scores")
			if got := ep == a && strings.Contains(scores, a); got != tc.expose || (!tc.expose && (ep != "" || scores != "")) {
				t.Errorf("endpoint %q scores %q, want exposed %v", ep, scores, tc.expose)
			}
			if resp.Header.Get("X-Kvgate-Scheduler") != "p" {
				t.Errorf("scheduler %q", resp.Header.Get("X-Kvgate-Scheduler"))
			}
		})
	}
}

// TestAuthThrottled: `kvgate serve` answers a client address that failed
// authentication auth.ThrottleFailures times within a minute with an OpenAI
// 429 and Retry-After, its good key included, before looking at it.
func TestAuthThrottled(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	cfg := gatewayConfig(scheduler("p", llama, a))
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey("sk-acme")}}}
	_, base := startGateway(t, cfg)
	for i := range auth.ThrottleFailures {
		if resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), "Authorization", "Bearer sk-guess"); resp.StatusCode != 401 {
			t.Fatalf("guess %d: %d %s", i, resp.StatusCode, raw)
		}
	}
	for _, key := range []string{"sk-guess", "sk-acme"} {
		resp, raw, e := call(t, "POST", base+"/v1/chat/completions", chat(llama), "Authorization", "Bearer "+key)
		if resp.StatusCode != 429 || e.Error.Type != "rate_limit_error" || resp.Header.Get("WWW-Authenticate") != "" {
			t.Fatalf("%s: %d %q %s; want an OpenAI 429 without a challenge", key, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), raw)
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
			t.Errorf("%s: Retry-After %q", key, resp.Header.Get("Retry-After"))
		}
	}
}
