package global

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/authtest"
	"github.com/kvgate/kvgate/internal/logtest"
)

func TestParse(t *testing.T) {
	const head = "apiVersion: gateway.kvgate.io/v1alpha1\nkind: GlobalRouterConfig\nspec:\n"
	const member = "  members:\n  - {name: a, url: 'http://a:8080', adminURL: 'http://a:9090', pricePerMillionTokens: 1}\n"
	for _, tc := range []struct {
		name, doc, want string // want: "" for valid, else a piece of the error, with its line
	}{
		{"minimal", head + member, ""},
		{"the example", "", ""},
		{"unknown field", head + member + "  routng: {}\n", "test.yaml:6: spec.routng: unknown field"},
		{"no members", head + "  members: []\n", "at least one member"},
		{"wrong type", head + member + "  routing: {maxAttempts: three}\n", "test.yaml:6: spec.routing.maxAttempts: must be an integer"},
		{"wrong kind", strings.Replace(head, "GlobalRouterConfig", "Gateway", 1) + member, `test.yaml:2: kind: is "Gateway", want "GlobalRouterConfig"`},
		{"bad URL", head + "  members:\n  - {name: a, url: 'a:8080', adminURL: 'http://a:9090'}\n", "test.yaml:5: spec.members[0].url: want an http(s) URL"},
		{"duplicate member", head + member + "  - {name: a, url: 'http://b:8080', adminURL: 'http://b:9090'}\n", "used twice"},
		{"two prices", head + "  members:\n  - {name: a, url: 'http://a', adminURL: 'http://a', pricePerMillionTokens: 1, pricePerGPUHour: 2, tokensPerGPUHour: 9}\n", "not both"},
		{"GPU-hour price without tokens", head + "  members:\n  - {name: a, url: 'http://a', adminURL: 'http://a', pricePerGPUHour: 2}\n", "tokensPerGPUHour"},
		{"zero heartbeat", head + member + "  routing: {heartbeatInterval: 0s}\n", "test.yaml:6: spec.routing.heartbeatInterval: must be > 0"},
		{"timeout under the interval", head + member + "  routing: {heartbeatInterval: 2s, heartbeatTimeout: 1s}\n", "at least heartbeatInterval"},
		{"timeout under the default interval", head + member + "  routing: {heartbeatTimeout: 100ms}\n", "at least heartbeatInterval"},
		{"negative first-byte timeout", head + member + "  routing: {firstByteTimeout: -1s}\n", "firstByteTimeout: must be ≥ 0"},
		{"first-byte timeout off", head + member + "  routing: {firstByteTimeout: 0s}\n", ""},
		{"objective with a newline", head + member + "  tenants: [{name: acme, objective: \"batch\\n\"}]\n", "spec.tenants[0].objective"},
		{"objective", head + member + "  tenants: [{name: acme, objective: batch}]\n", ""},
		{"tenant named *", head + member + "  tenants: [{name: '*'}]\n", "not \"*\""},
		{"tenant limit without model", head + member + "  tenants: [{name: acme, limits: [{requestsPerMinute: 5}]}]\n", "limits[0].model"},
		{"negative limit", head + member + "  tenants: [{name: acme, limits: [{model: '*', requestsPerMinute: -1}]}]\n", "must be ≥ 0"},
		{"bad fail mode", head + member + "  rateLimit: {redis: 'r:6379', failMode: maybe}\n", "failMode"},
		{"rate limit without redis", head + member + "  rateLimit: {failMode: open}\n", "rateLimit.redis"},
		{"bad key hash", head + member + "  auth: {apiKeys: [{tenant: acme, hash: 'sha256:zz'}]}\n", "test.yaml:6: spec.auth.apiKeys[0].hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.doc == "" {
				_, err = Load("../../deploy/examples/global.yaml")
			} else {
				_, err = Parse("test.yaml", []byte(tc.doc))
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid document refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestPrice: a price per GPU-hour becomes one per million tokens.
func TestPrice(t *testing.T) {
	four, rate := 4.0, 5e6
	if p := (Member{PricePerGPUHour: &four, TokensPerGPUHour: &rate}).Price(); p < 0.8-1e-12 || p > 0.8+1e-12 {
		t.Fatalf("4 an hour at 5M tokens an hour: %v per million, want 0.8", p)
	}
}

// TestParseAuth: spec.auth is the InferenceGatewayConfig's AuthSpec, read
// strictly and checked by its validator, each error naming its field and line.
func TestParseAuth(t *testing.T) {
	const head = "apiVersion: gateway.kvgate.io/v1alpha1\nkind: GlobalRouterConfig\nspec:\n" +
		"  members:\n  - {name: a, url: 'http://a:8080', adminURL: 'http://a:9090'}\n  auth:\n"
	t.Run("full", func(t *testing.T) {
		cfg, err := Parse("g.yaml", []byte(head+`    apiKeys:
    - tenant: acme
      hash: `+auth.HashKey("sk-acme")+`
    jwt:
      jwksURI: https://idp.example.com/.well-known/jwks.json
      issuer: https://idp.example.com/
      audiences: [kvgate, other]
      tenantClaim: org.id
      requiredClaims: [{name: scope, values: [inference]}]
      refreshInterval: 2m
      leeway: 10s
      fetchTimeout: 3s
    allowAnonymous: true
`))
		if err != nil {
			t.Fatal(err)
		}
		a := cfg.Spec.Auth
		j := a.JWT
		if len(a.APIKeys) != 1 || a.APIKeys[0].Tenant != "acme" || !a.AllowAnonymous ||
			j == nil || j.JWKSURI != "https://idp.example.com/.well-known/jwks.json" || j.TenantClaim != "org.id" || len(j.Audiences) != 2 ||
			len(j.RequiredClaims) != 1 || j.RefreshInterval.Duration != 2*time.Minute || j.Leeway.Duration != 10*time.Second || j.FetchTimeout.Duration != 3*time.Second {
			t.Fatalf("parsed %+v, jwt %+v", a, j)
		}
		if w := cfg.Deprecated(); len(w) != 0 {
			t.Fatalf("deprecation warnings %q for a file with the current names", w)
		}
	})
	// The tier-2 names of before are read for a release, each noted for a
	// warning naming its successor and its line.
	t.Run("former names", func(t *testing.T) {
		cfg, err := Parse("g.yaml", []byte(head+"    jwt:\n      jwksURL: https://idp/jwks\n      audience: [kvgate]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if j := cfg.Spec.Auth.JWT; j.JWKSURI != "https://idp/jwks" || len(j.Audiences) != 1 || j.Audiences[0] != "kvgate" {
			t.Fatalf("parsed %+v", j)
		}
		want := []string{"g.yaml:8: spec.auth.jwt.jwksURL is deprecated; use jwksURI", "g.yaml:9: spec.auth.jwt.audience is deprecated; use audiences"}
		if got := cfg.Deprecated(); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("warnings %q, want %q", got, want)
		}
	})
	for _, c := range []struct{ name, doc, want string }{
		{"unknown field", "    apiKeys: []\n    allowAnonymus: true\n", "g.yaml:8: spec.auth.allowAnonymus: unknown field"},
		{"nested unknown", "    jwt:\n      jwks_uri: https://idp/jwks\n", "g.yaml:8: spec.auth.jwt.jwks_uri: unknown field"},
		{"bad duration", "    jwt:\n      jwksURI: https://idp/jwks\n      refreshInterval: 5\n", "g.yaml:9: spec.auth.jwt.refreshInterval"},
		{"fails validation", "    apiKeys:\n    - tenant: a\n      hash: sha256:00\n", "g.yaml:9: spec.auth.apiKeys[0].hash: want 64 hex digits"},
		{"wrong type", "    allowAnonymous: maybe\n", "g.yaml:7: spec.auth.allowAnonymous: must be true or false"},
		{"nothing configured", "    allowAnonymous: false\n", "g.yaml:6: spec.auth: no authentication configured"},
		{"leeway too large", "    jwt: {jwksURI: 'https://idp/jwks', leeway: 6m}\n", "g.yaml:7: spec.auth.jwt.leeway: must be between 0 and 5m0s"},
		{"fetch timeout", "    jwt: {jwksURI: 'https://idp/jwks', fetchTimeout: 0s}\n", "spec.auth.jwt.fetchTimeout: must be positive"},
		{"former name validated at its line", "    jwt:\n      jwksURL: ftp://idp/jwks\n", "g.yaml:8: spec.auth.jwt.jwksURI: want an absolute http or https URL"},
		{"former and current name", "    jwt:\n      jwksURI: https://idp/jwks\n      jwksURL: https://idp/jwks\n",
			"g.yaml:9: spec.auth.jwt.jwksURL: is the deprecated name of jwksURI, which is set too: keep only jwksURI"},
		{"both audiences", "    jwt:\n      audience: [a]\n      jwksURI: https://idp/jwks\n      audiences: [b]\n",
			"g.yaml:8: spec.auth.jwt.audience: is the deprecated name of audiences, which is set too: keep only audiences"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("g.yaml", []byte(head+c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestReloadWarnsDeprecated: a configuration applied with a former field name
// logs its warning once; one without logs none.
func TestReloadWarnsDeprecated(t *testing.T) {
	idp := authtest.New(t)
	var logged logtest.Buffer
	r := New(routerConfig(steadyRouting(), Member{Name: "a", URL: "http://127.0.0.1:1", AdminURL: "http://127.0.0.1:1"}),
		Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	dp := newDeps(context.Background(), &Options{Logger: quiet})
	defer dp.close()
	doc := func(jwt string) []byte {
		return []byte("apiVersion: gateway.kvgate.io/v1alpha1\nkind: GlobalRouterConfig\nspec:\n" +
			"  members:\n  - {name: a, url: 'http://127.0.0.1:1', adminURL: 'http://127.0.0.1:1'}\n" +
			"  auth:\n    jwt: {" + jwt + ": '" + idp.URL + "'}\n")
	}
	const warning = "spec.auth.jwt.jwksURL is deprecated; use jwksURI"
	r.reload("g.yaml", doc("jwksURL"), nil, dp)
	if n := strings.Count(logged.String(), warning); n != 1 {
		t.Fatalf("the warning logged %d times, want once: %s", n, logged.String())
	}
	r.mu.Lock()
	active := r.active
	r.mu.Unlock()
	if a := active.Spec.Auth; a == nil || a.JWT.JWKSURI != idp.URL {
		t.Fatalf("the configuration with the former name not applied: %s", logged.String())
	}
	r.reload("g.yaml", doc("jwksURI"), nil, dp)
	if n := strings.Count(logged.String(), warning); n != 1 {
		t.Fatalf("the warning logged %d times after a file without the former name, want once: %s", n, logged.String())
	}
}

// TestStallBoundDefaults: tier 2's stall bounds default to tier 1's (15 s and
// 30 s, below the 60 s after which common proxies cut a silent connection).
func TestStallBoundDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		routing               Routing
		firstByte, streamIdle time.Duration
	}{
		{name: "defaults", firstByte: v1alpha1.DefaultFirstByteTimeout, streamIdle: v1alpha1.DefaultStreamIdleTimeout},
		{name: "set", routing: Routing{FirstByteTimeout: d(2 * time.Minute), StreamIdleTimeout: d(90 * time.Second)}, firstByte: 2 * time.Minute, streamIdle: 90 * time.Second},
		{name: "off", routing: Routing{FirstByteTimeout: d(0), StreamIdleTimeout: d(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.routing.settings()
			if s.firstByteTimeout != tc.firstByte || s.streamIdle != tc.streamIdle {
				t.Errorf("firstByteTimeout %v, streamIdleTimeout %v; want %v, %v", s.firstByteTimeout, s.streamIdle, tc.firstByte, tc.streamIdle)
			}
		})
	}
}
