package auth_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
)

// Test keys, generated once per test binary: RSA generation is slow under
// -race.
var (
	rsaKey1 = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA(2048) })
	rsaKey2 = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA(2048) })
	ecKey   = sync.OnceValue(func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
	edKey = sync.OnceValue(func() ed25519.PrivateKey {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
)

func mustRSA(bits int) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		panic(err)
	}
	return k
}

const (
	testIssuer   = "https://idp.test/"
	testAudience = "kvgate"
)

// t0 is the fake clock's start.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is a settable clock for exp/nbf and the refresh rate limit.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// jwksServer serves a JWKS on loopback that tests can change or break.
type jwksServer struct {
	*httptest.Server
	hits atomic.Int64

	mu     sync.Mutex
	body   []byte
	status int
	hang   bool // answer only when the client gives up
}

func newJWKSServer(t testing.TB, keys ...jose.JSONWebKey) *jwksServer {
	t.Helper()
	s := &jwksServer{status: http.StatusOK}
	s.setKeys(t, keys...)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		status, body, hang := s.status, s.body, s.hang
		s.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

// setKeys serves the public halves of keys.
func (s *jwksServer) setKeys(t testing.TB, keys ...jose.JSONWebKey) {
	t.Helper()
	body, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	s.setBody(http.StatusOK, body)
}

func (s *jwksServer) setBody(status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body, s.hang = status, body, false
}

func (s *jwksServer) setHang() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang = true
}

// jwk is the public JWK of a private key.
func jwk(priv crypto.Signer, kid, alg string) jose.JSONWebKey {
	return jose.JSONWebKey{Key: priv.Public(), KeyID: kid, Algorithm: alg, Use: "sig"}
}

// sign makes a token; kid "" leaves the header without one.
func sign(t testing.TB, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// goodClaims are claims every check accepts at the fake clock's start.
func goodClaims(sub string) jwt.MapClaims {
	return jwt.MapClaims{
		"iss": testIssuer,
		"aud": testAudience,
		"sub": sub,
		"iat": t0.Unix(),
		"exp": t0.Add(time.Hour).Unix(),
	}
}

// with returns a copy of c with kv set; a nil value deletes the claim.
func with(c jwt.MapClaims, kv ...any) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// jwtConfig accepts tokens from srv for the test issuer and audience.
func jwtConfig(srv *jwksServer) *v1alpha1.JWTSpec {
	return &v1alpha1.JWTSpec{JWKSURI: srv.URL, Issuer: testIssuer, Audiences: []string{testAudience}}
}

// newAuth builds an Authenticator on its own registry, closed at the end of
// the test.
func newAuth(t testing.TB, spec *v1alpha1.AuthSpec, clock *fakeClock) (*auth.Authenticator, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := auth.Options{Registerer: reg, Logger: slog.New(slog.DiscardHandler)}
	if clock != nil {
		opts.Now = clock.Now
	}
	a, err := auth.New(context.Background(), spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, reg
}

// request is a request with the given header name/value pairs.
func request(kv ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	for i := 0; i < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// check compares Authenticate's outcome with a tenant (reason "") or a
// refusal reason.
func check(t *testing.T, a *auth.Authenticator, r *http.Request, wantTenant string, wantReason auth.Reason) {
	t.Helper()
	if wantReason == "" {
		mustOK(t, a, r, wantTenant)
	} else {
		_ = mustFail(t, a, r, wantReason)
	}
}

// mustOK authenticates r and checks its tenant.
func mustOK(t *testing.T, a *auth.Authenticator, r *http.Request, wantTenant string) auth.Identity {
	t.Helper()
	id, err := a.Authenticate(r)
	if err != nil {
		t.Fatalf("Authenticate: %v, want tenant %q", err, wantTenant)
	}
	if id.Tenant != wantTenant {
		t.Fatalf("tenant %q, want %q", id.Tenant, wantTenant)
	}
	return id
}

// mustFail checks that r is refused for wantReason.
func mustFail(t *testing.T, a *auth.Authenticator, r *http.Request, wantReason auth.Reason) *auth.Error {
	t.Helper()
	id, err := a.Authenticate(r)
	var ae *auth.Error
	if !errors.As(err, &ae) {
		t.Fatalf("Authenticate = %+v, %v; want *auth.Error with reason %s", id, err, wantReason)
	}
	if ae.Reason != wantReason {
		t.Fatalf("reason %s (%v), want %s", ae.Reason, err, wantReason)
	}
	return ae
}
