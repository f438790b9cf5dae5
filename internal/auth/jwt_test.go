package auth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/promtest"
)

// standardJWKS serves one RSA, one EC P-256 and one Ed25519 key.
func standardJWKS(t testing.TB) *jwksServer {
	return newJWKSServer(t,
		jwk(rsaKey1(), "rsa-1", ""), // no alg: RS* and PS* both fit
		jwk(ecKey(), "ec-1", "ES256"),
		jwk(edKey(), "ed-1", "EdDSA"))
}

func TestJWT(t *testing.T) {
	srv := standardJWKS(t)
	clock := newClock()
	cfg := apiKeyConfig()
	cfg.JWT = jwtConfig(srv)
	a, reg := newAuth(t, cfg, clock)

	pubDER, err := x509.MarshalPKIXPublicKey(rsaKey1().Public())
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	good := goodClaims("acme")
	rs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", c) }

	tests := []struct {
		name       string
		token      string
		wantTenant string
		wantReason auth.Reason
		wantDetail string
	}{
		{name: "RS256", token: rs(good), wantTenant: "acme"},
		{name: "RS512", token: sign(t, jwt.SigningMethodRS512, rsaKey1(), "rsa-1", good), wantTenant: "acme"},
		{name: "PS256", token: sign(t, jwt.SigningMethodPS256, rsaKey1(), "rsa-1", good), wantTenant: "acme"},
		{name: "ES256", token: sign(t, jwt.SigningMethodES256, ecKey(), "ec-1", good), wantTenant: "acme"},
		{name: "EdDSA", token: sign(t, jwt.SigningMethodEdDSA, edKey(), "ed-1", good), wantTenant: "acme"},
		{name: "no kid", token: sign(t, jwt.SigningMethodES256, ecKey(), "", good), wantTenant: "acme"},
		{name: "audience list", token: rs(with(good, "aud", []string{"other", testAudience})), wantTenant: "acme"},
		{name: "expired within leeway", token: rs(with(good, "exp", t0.Add(-10*time.Second).Unix())), wantTenant: "acme"},
		{name: "nbf within leeway", token: rs(with(good, "nbf", t0.Add(10*time.Second).Unix())), wantTenant: "acme"},
		{name: "expired", token: rs(with(good, "exp", t0.Add(-time.Minute).Unix())),
			wantReason: auth.ReasonExpired, wantDetail: "expired"},
		{name: "not yet valid", token: rs(with(good, "nbf", t0.Add(time.Minute).Unix())),
			wantReason: auth.ReasonNotYetValid, wantDetail: "not yet valid"},
		{name: "no exp", token: rs(with(good, "exp", nil)),
			wantReason: auth.ReasonMissingClaim, wantDetail: "missing exp claim"},
		{name: "wrong issuer", token: rs(with(good, "iss", "https://evil.test/")),
			wantReason: auth.ReasonWrongIssuer, wantDetail: "wrong issuer"},
		{name: "no issuer", token: rs(with(good, "iss", nil)),
			wantReason: auth.ReasonMissingClaim, wantDetail: "missing iss claim"},
		{name: "wrong audience", token: rs(with(good, "aud", "someone-else")),
			wantReason: auth.ReasonWrongAudience, wantDetail: "wrong audience"},
		{name: "no audience", token: rs(with(good, "aud", nil)),
			wantReason: auth.ReasonMissingClaim, wantDetail: "missing aud claim"},
		{name: "bad signature", token: sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-1", good),
			wantReason: auth.ReasonBadSignature, wantDetail: "signature is invalid"},
		{name: "tampered payload", token: tamper(t, rs(good), with(good, "sub", "beta")),
			wantReason: auth.ReasonBadSignature},
		{name: "key of another type", token: sign(t, jwt.SigningMethodES256, ecKey(), "rsa-1", good),
			wantReason: auth.ReasonBadSignature, wantDetail: "signing key does not fit the algorithm"},
		{name: "alg differs from the key's", token: sign(t, jwt.SigningMethodES384, mustP384(t), "ec-1", good),
			wantReason: auth.ReasonBadSignature},
		{name: "unknown kid", token: sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-9", good),
			wantReason: auth.ReasonUnknownKID, wantDetail: "unknown signing key"},
		{name: "alg none", token: sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "rsa-1", good),
			wantReason: auth.ReasonUnsupportedAlg, wantDetail: `signing algorithm "none" is not accepted`},
		// Algorithm confusion: the public key, known to all, used as an HMAC
		// secret.
		{name: "HS256 with the public key PEM", token: sign(t, jwt.SigningMethodHS256, pubPEM, "rsa-1", good),
			wantReason: auth.ReasonUnsupportedAlg, wantDetail: `signing algorithm "HS256" is not accepted`},
		{name: "HS256 with the public key DER", token: sign(t, jwt.SigningMethodHS256, pubDER, "", good),
			wantReason: auth.ReasonUnsupportedAlg},
		{name: "unknown alg", token: rawToken(t, map[string]any{"alg": "XX999", "kid": "rsa-1"}, good),
			wantReason: auth.ReasonUnsupportedAlg, wantDetail: "unknown signing algorithm"},
		{name: "malformed", token: "aaaa.bbbb.cccc", wantReason: auth.ReasonMalformed, wantDetail: "malformed"},
		{name: "missing tenant claim", token: rs(with(good, "sub", nil)),
			wantReason: auth.ReasonNoTenant, wantDetail: `missing tenant claim "sub"`},
		{name: "empty tenant claim", token: rs(with(good, "sub", "")), wantReason: auth.ReasonNoTenant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(bearer(tt.token)...)
			if tt.wantReason == "" {
				if id := mustOK(t, a, r, tt.wantTenant); id.Method != auth.MethodJWT {
					t.Fatalf("method %q", id.Method)
				}
				return
			}
			ae := mustFail(t, a, r, tt.wantReason)
			if ae.Method != auth.MethodJWT {
				t.Errorf("error method %q", ae.Method)
			}
			msg := ae.Message()
			if !strings.HasPrefix(msg, "Invalid token: ") || tt.wantDetail != "" && msg != "Invalid token: "+tt.wantDetail+"." {
				t.Errorf("message %q, want %q", msg, "Invalid token: "+tt.wantDetail+".")
			}
			if strings.Contains(msg, tt.token) || strings.Contains(ae.Error(), tt.token) {
				t.Error("the error echoes the token")
			}
		})
	}
	// API keys keep working beside JWT.
	t.Run("api key beside jwt", func(t *testing.T) { check(t, a, request("api-key", keyAcme), "acme", "") })

	if got := promtest.Value(t, reg, "kvgate_auth_requests_total", "method", "jwt", "result", "ok"); got != 9 {
		t.Errorf("jwt ok = %v, want 9", got)
	}
	if got := promtest.Value(t, reg, "kvgate_auth_requests_total", "method", "jwt", "result", "unsupported_alg"); got != 4 {
		t.Errorf("jwt unsupported_alg = %v, want 4", got)
	}
}

// tamper replaces the payload of a signed token, keeping its signature.
func tamper(t *testing.T, tok string, claims jwt.MapClaims) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	return strings.Join(parts, ".")
}

// rawToken builds a token with any header and a junk signature.
func rawToken(t *testing.T, header map[string]any, claims jwt.MapClaims) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(c) + "." + enc([]byte("sig"))
}

func TestTenantClaim(t *testing.T) {
	srv := standardJWKS(t)
	base := goodClaims("subject")
	tests := []struct {
		name       string
		claim      string
		claims     jwt.MapClaims
		wantTenant string
		wantReason auth.Reason
	}{
		{name: "default sub", claims: base, wantTenant: "subject"},
		{name: "top level", claim: "tenant", claims: with(base, "tenant", "acme"), wantTenant: "acme"},
		{name: "nested", claim: "org.id", claims: with(base, "org", map[string]any{"id": "acme", "name": "Acme"}), wantTenant: "acme"},
		{name: "deeply nested", claim: "a.b.c", claims: with(base, "a", map[string]any{"b": map[string]any{"c": "deep"}}), wantTenant: "deep"},
		{name: "integer", claim: "org.id", claims: with(base, "org", map[string]any{"id": 9007199254740993}), wantTenant: "9007199254740993"},
		{name: "name with dots", claim: "https://kvgate.dev/tenant", claims: with(base, "https://kvgate.dev/tenant", "acme"), wantTenant: "acme"},
		{name: "dotted name then nested", claim: "https://kvgate.dev/org.id",
			claims: with(base, "https://kvgate.dev/org", map[string]any{"id": "acme"}), wantTenant: "acme"},
		{name: "nested missing", claim: "org.id", claims: with(base, "org", map[string]any{"name": "Acme"}), wantReason: auth.ReasonNoTenant},
		{name: "parent not an object", claim: "org.id", claims: with(base, "org", "acme"), wantReason: auth.ReasonNoTenant},
		{name: "object", claim: "org", claims: with(base, "org", map[string]any{"id": "acme"}), wantReason: auth.ReasonNoTenant},
		{name: "fraction", claim: "org.id", claims: with(base, "org", map[string]any{"id": 4.5}), wantReason: auth.ReasonNoTenant},
		{name: "boolean", claim: "admin", claims: with(base, "admin", true), wantReason: auth.ReasonNoTenant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jc := jwtConfig(srv)
			jc.TenantClaim = tt.claim
			a, _ := newAuth(t, &v1alpha1.AuthSpec{JWT: jc}, newClock())
			tok := sign(t, jwt.SigningMethodES256, ecKey(), "ec-1", tt.claims)
			check(t, a, request(bearer(tok)...), tt.wantTenant, tt.wantReason)
		})
	}
}

func mustP384(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
