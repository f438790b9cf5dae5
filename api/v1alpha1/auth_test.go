package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func keyHash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return KeyHashPrefix + hex.EncodeToString(sum[:])
}

// TestAuthValidate: the one validator of spec.auth, which kvgate serve and
// epp (InferenceGatewayConfig) and kvgate global (GlobalRouterConfig) share.
func TestAuthValidate(t *testing.T) {
	good := keyHash("sk-good")
	jwtOK := func(mod func(*JWTSpec)) *AuthSpec {
		j := &JWTSpec{JWKSURI: "https://idp.example.com/jwks.json"}
		mod(j)
		return &AuthSpec{JWT: j}
	}
	tests := []struct {
		name string
		at   string
		spec *AuthSpec
		want []string // "path: message" pieces of the problems; none: valid
	}{
		{name: "api keys", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "acme", Hash: good}, {Tenant: "beta", Hash: keyHash("sk-2")}}}},
		{name: "upper-case hex", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "acme", Hash: "sha256:" + strings.ToUpper(strings.TrimPrefix(good, "sha256:"))}}}},
		{name: "jwt", spec: jwtOK(func(*JWTSpec) {})},
		{name: "jwt with every field", spec: jwtOK(func(j *JWTSpec) {
			j.Issuer, j.Audiences, j.TenantClaim = "https://idp/", []string{"kvgate"}, "org.id"
			j.RequiredClaims = []ClaimRequirement{{Name: "scope", Values: []string{"inference"}}}
			j.RefreshInterval, j.Leeway, j.FetchTimeout = dur(time.Second), dur(MaxLeeway), dur(time.Millisecond)
		})},
		{name: "no leeway", spec: jwtOK(func(j *JWTSpec) { j.Leeway = dur(0) })},
		{name: "anonymous only", spec: &AuthSpec{AllowAnonymous: true}},
		{name: "nothing", spec: &AuthSpec{}, want: []string{"no authentication configured"}},
		{name: "nothing, in a document", at: "spec.auth", spec: &AuthSpec{}, want: []string{"spec.auth: no authentication configured"}},
		{name: "no prefix", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: strings.TrimPrefix(good, "sha256:")}}},
			want: []string{`apiKeys[0].hash: must start with "sha256:"`}},
		{name: "short hex", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: good[:40]}}},
			want: []string{"apiKeys[0].hash: want 64 hex digits"}},
		{name: "not hex", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: "sha256:" + strings.Repeat("zz", 32)}}},
			want: []string{"apiKeys[0].hash: not hexadecimal"}},
		{name: "empty tenant", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: " ", Hash: good}}},
			want: []string{"apiKeys[0].tenant: must not be empty"}},
		{name: "duplicate", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: good}, {Tenant: "b", Hash: keyHash("x")}, {Tenant: "c", Hash: good}}},
			want: []string{`apiKeys[2].hash: same key as apiKeys[0] (tenant "a")`}},
		{name: "upper-case prefix, in a document", at: "spec.auth",
			spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: good}, {Tenant: "c", Hash: strings.ToUpper(good[:9]) + good[9:]}}},
			want: []string{`spec.auth.apiKeys[1].hash: must start with`}},
		{name: "duplicate upper-case hex, in a document", at: "spec.auth",
			spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: good}, {Tenant: "c", Hash: "sha256:" + strings.ToUpper(good[7:])}}},
			want: []string{`spec.auth.apiKeys[1].hash: same key as spec.auth.apiKeys[0] (tenant "a")`}},
		{name: "too many keys", spec: func() *AuthSpec {
			a := &AuthSpec{APIKeys: make([]APIKeySpec, maxAPIKeys+1)}
			for i := range a.APIKeys {
				a.APIKeys[i] = APIKeySpec{Tenant: "t", Hash: keyHash(strings.Repeat("k", i+1))}
			}
			return a
		}(), want: []string{"apiKeys: lists 10001 keys, at most 10000 allowed"}},
		{name: "every problem reported", spec: &AuthSpec{APIKeys: []APIKeySpec{{Tenant: "", Hash: "md5:x"}}, JWT: &JWTSpec{}},
			want: []string{"apiKeys[0].tenant", "apiKeys[0].hash", "jwt.jwksURI: is required"}},
		{name: "jwks url scheme", spec: jwtOK(func(j *JWTSpec) { j.JWKSURI = "ftp://idp/jwks" }),
			want: []string{"jwt.jwksURI: want an absolute http or https URL"}},
		{name: "jwks url relative", spec: jwtOK(func(j *JWTSpec) { j.JWKSURI = "/jwks.json" }),
			want: []string{"jwt.jwksURI: want an absolute"}},
		{name: "empty audience", spec: jwtOK(func(j *JWTSpec) { j.Audiences = []string{"a", ""} }),
			want: []string{"jwt.audiences[1]: must not be empty"}},
		{name: "tenant claim", spec: jwtOK(func(j *JWTSpec) { j.TenantClaim = "org..id" }),
			want: []string{"jwt.tenantClaim"}},
		{name: "required claim", at: "spec.auth", spec: jwtOK(func(j *JWTSpec) { j.RequiredClaims = []ClaimRequirement{{Name: "a."}} }),
			want: []string{"spec.auth.jwt.requiredClaims[0].name: must be a claim name", "spec.auth.jwt.requiredClaims[0].values: must list at least one value"}},
		{name: "refresh too often", spec: jwtOK(func(j *JWTSpec) { j.RefreshInterval = dur(10 * time.Millisecond) }),
			want: []string{"jwt.refreshInterval: must be at least 1s"}},
		{name: "leeway too large", spec: jwtOK(func(j *JWTSpec) { j.Leeway = dur(time.Hour) }),
			want: []string{"jwt.leeway: must be between 0 and 5m0s"}},
		{name: "leeway negative", spec: jwtOK(func(j *JWTSpec) { j.Leeway = dur(-time.Second) }),
			want: []string{"jwt.leeway: must be between 0 and 5m0s"}},
		{name: "fetch timeout", spec: jwtOK(func(j *JWTSpec) { j.FetchTimeout = dur(0) }),
			want: []string{"jwt.fetchTimeout: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems := tt.spec.Validate(tt.at)
			var got []string
			for _, p := range problems {
				got = append(got, p.Error())
			}
			all := strings.Join(got, "; ")
			if len(tt.want) == 0 {
				if len(problems) > 0 {
					t.Fatalf("Validate: %s", all)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems %q lack %q", all, w)
				}
			}
		})
	}
}

// An operator who pastes the raw key where its hash belongs must not find the
// key in the logs.
func TestAuthValidateDoesNotEchoKey(t *testing.T) {
	const raw = "sk-live-0123456789abcdef"
	for _, hash := range []string{raw, "sha256:" + raw, "sha256:" + strings.Repeat("z", 64-len(raw)) + raw} {
		problems := (&AuthSpec{APIKeys: []APIKeySpec{{Tenant: "a", Hash: hash}}}).Validate("spec.auth")
		if len(problems) == 0 || strings.Contains(problems[0].Error(), raw) {
			t.Fatalf("Validate = %v; want a problem without the key", problems)
		}
	}
}

// TestAuthValidateInDocument: an InferenceGatewayConfig reports spec.auth's
// problems at their paths in the document.
func TestAuthValidateInDocument(t *testing.T) {
	errs := config(func(c *InferenceGatewayConfig) {
		c.Spec.Auth = &AuthSpec{JWT: &JWTSpec{JWKSURI: "https://idp/jwks", Leeway: dur(time.Hour), FetchTimeout: dur(-time.Second)}}
	}).Validate()
	want := []string{"spec.auth.jwt.fetchTimeout: must be positive, got -1s", "spec.auth.jwt.leeway: must be between 0 and 5m0s, got 1h0m0s"}
	if len(errs) != len(want) {
		t.Fatalf("Validate() = %v, want %q", errs, want)
	}
	for i, e := range errs {
		if e.Error() != want[i] {
			t.Errorf("problem %d: %q, want %q", i, e.Error(), want[i])
		}
	}
}
