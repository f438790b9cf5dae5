package auth_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/internal/auth"
)

func TestHashKey(t *testing.T) {
	// SHA-256 of "abc", FIPS 180-2 appendix B.1.
	const want = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := auth.HashKey("abc"); got != want {
		t.Fatalf("HashKey(abc) = %s, want %s", got, want)
	}
	// The shell recipe in the documentation gives the same.
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	out, err := exec.Command("sh", "-c", `KEY=abc; printf %s "$KEY" | sha256sum | awk '{print "sha256:" $1}'`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("shell recipe gives %s, want %s", got, want)
	}
}

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func TestConfigValidate(t *testing.T) {
	good := auth.HashKey("sk-good")
	jwtOK := func(mod func(*auth.JWTConfig)) auth.Config {
		j := &auth.JWTConfig{JWKSURL: "https://idp.example.com/jwks.json"}
		mod(j)
		return auth.Config{JWT: j}
	}
	tests := []struct {
		name string
		cfg  auth.Config
		want []string // substrings of the error; none: valid
	}{
		{name: "api keys", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "acme", Hash: good}, {Tenant: "beta", Hash: auth.HashKey("sk-2")}}}},
		{name: "upper-case hex", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "acme", Hash: "sha256:" + strings.ToUpper(strings.TrimPrefix(good, "sha256:"))}}}},
		{name: "jwt", cfg: jwtOK(func(*auth.JWTConfig) {})},
		{name: "anonymous only", cfg: auth.Config{AllowAnonymous: true}},
		{name: "nothing", cfg: auth.Config{}, want: []string{"no authentication configured"}},
		{name: "no prefix", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "a", Hash: strings.TrimPrefix(good, "sha256:")}}},
			want: []string{`apiKeys[0].hash: must start with "sha256:"`}},
		{name: "short hex", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "a", Hash: good[:40]}}},
			want: []string{"apiKeys[0].hash: want 64 hex digits"}},
		{name: "not hex", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "a", Hash: "sha256:" + strings.Repeat("zz", 32)}}},
			want: []string{"apiKeys[0].hash: not hexadecimal"}},
		{name: "empty tenant", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: " ", Hash: good}}},
			want: []string{"apiKeys[0].tenant: must not be empty"}},
		{name: "duplicate", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "a", Hash: good}, {Tenant: "b", Hash: auth.HashKey("x")}, {Tenant: "c", Hash: good}}},
			want: []string{`apiKeys[2].hash: same key as apiKeys[0] (tenant "a")`}},
		{name: "every problem reported", cfg: auth.Config{APIKeys: []auth.APIKey{{Tenant: "", Hash: "md5:x"}}, JWT: &auth.JWTConfig{}},
			want: []string{"apiKeys[0].tenant", "apiKeys[0].hash", "jwt.jwksURL: required"}},
		{name: "jwks url scheme", cfg: jwtOK(func(j *auth.JWTConfig) { j.JWKSURL = "ftp://idp/jwks" }),
			want: []string{"jwt.jwksURL: want an absolute http or https URL"}},
		{name: "jwks url relative", cfg: jwtOK(func(j *auth.JWTConfig) { j.JWKSURL = "/jwks.json" }),
			want: []string{"jwt.jwksURL: want an absolute"}},
		{name: "empty audience", cfg: jwtOK(func(j *auth.JWTConfig) { j.Audience = []string{"a", ""} }),
			want: []string{"jwt.audience[1]: must not be empty"}},
		{name: "tenant claim", cfg: jwtOK(func(j *auth.JWTConfig) { j.TenantClaim = "org..id" }),
			want: []string{"jwt.tenantClaim"}},
		{name: "refresh too often", cfg: jwtOK(func(j *auth.JWTConfig) { j.RefreshInterval = dur(10 * time.Millisecond) }),
			want: []string{"jwt.refreshInterval: must be at least 1s"}},
		{name: "leeway too large", cfg: jwtOK(func(j *auth.JWTConfig) { j.Leeway = dur(time.Hour) }),
			want: []string{"jwt.leeway: must be between 0 and 5m0s"}},
		{name: "fetch timeout", cfg: jwtOK(func(j *auth.JWTConfig) { j.FetchTimeout = dur(0) }),
			want: []string{"jwt.fetchTimeout: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate passed, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// An operator who pastes the raw key where its hash belongs must not find the
// key in the logs.
func TestConfigValidateDoesNotEchoKey(t *testing.T) {
	const raw = "sk-live-0123456789abcdef"
	err := auth.Config{APIKeys: []auth.APIKey{{Tenant: "a", Hash: raw}}}.Validate()
	if err == nil || strings.Contains(err.Error(), raw) {
		t.Fatalf("Validate = %v; want an error without the key", err)
	}
}

func TestParseConfig(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		cfg, err := auth.ParseConfig("auth.yaml", []byte(`
apiKeys:
- tenant: acme
  hash: `+auth.HashKey("sk-acme")+`
jwt:
  jwksURL: https://idp.example.com/.well-known/jwks.json
  issuer: https://idp.example.com/
  audience: [kvgate, other]
  tenantClaim: org.id
  refreshInterval: 2m
  leeway: 10s
  fetchTimeout: 3s
allowAnonymous: true
`))
		if err != nil {
			t.Fatal(err)
		}
		j := cfg.JWT
		if len(cfg.APIKeys) != 1 || cfg.APIKeys[0].Tenant != "acme" || !cfg.AllowAnonymous ||
			j == nil || j.TenantClaim != "org.id" || len(j.Audience) != 2 ||
			j.RefreshInterval.Duration != 2*time.Minute || j.Leeway.Duration != 10*time.Second || j.FetchTimeout.Duration != 3*time.Second {
			t.Fatalf("parsed %+v, jwt %+v", cfg, j)
		}
	})
	// Each error names the field and its line.
	for _, c := range []struct{ name, doc, want string }{
		{"unknown field", "apiKeys: []\nallowAnonymus: true\n", "auth.yaml:2: allowAnonymus: unknown field"},
		{"nested unknown", "jwt:\n  jwks_uri: https://idp/jwks\n", "auth.yaml:2: jwt.jwks_uri: unknown field"},
		{"bad duration", "jwt:\n  jwksURL: https://idp/jwks\n  refreshInterval: 5\n", "auth.yaml"},
		{"fails Validate", "apiKeys:\n- tenant: a\n  hash: sha256:00\n", "auth.yaml:3: apiKeys[0].hash: "},
		{"wrong type", "allowAnonymous: maybe\n", "auth.yaml:1: allowAnonymous: must be true or false"},
		{"empty documents", "", "auth.yaml: the document is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := auth.ParseConfig("auth.yaml", []byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseConfig(%q): %v, want an error with %q", c.doc, err, c.want)
			}
		})
	}
}
