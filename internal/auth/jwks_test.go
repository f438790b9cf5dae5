package auth_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/promtest"
)

func refreshes(t *testing.T, reg prometheus.Gatherer, trigger, result string) float64 {
	t.Helper()
	return promtest.Value(t, reg, "kvgate_auth_jwks_refreshes_total", "trigger", trigger, "result", result)
}

// A token signed by a key rotated in after startup is accepted once the
// unknown kid has triggered a refresh, at most one per 30 s.
func TestJWKSRotation(t *testing.T) {
	srv := newJWKSServer(t, jwk(rsaKey1(), "rsa-1", "RS256"))
	clock := newClock()
	a, reg := newAuth(t, &v1alpha1.AuthSpec{JWT: jwtConfig(srv)}, clock)
	if srv.hits.Load() != 1 {
		t.Fatalf("%d fetches at startup, want 1", srv.hits.Load())
	}
	old := sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", goodClaims("acme"))
	rotated := sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-2", goodClaims("beta"))

	srv.setKeys(t, jwk(rsaKey1(), "rsa-1", "RS256"), jwk(rsaKey2(), "rsa-2", "RS256"))

	t.Run("within 30s of the last fetch", func(t *testing.T) {
		clock.Advance(10 * time.Second)
		check(t, a, request(bearer(rotated)...), "", auth.ReasonUnknownKID)
		if n := srv.hits.Load(); n != 1 {
			t.Fatalf("%d fetches, want still 1", n)
		}
	})
	t.Run("after 30s the unknown kid fetches", func(t *testing.T) {
		clock.Advance(21 * time.Second)
		check(t, a, request(bearer(rotated)...), "beta", "")
		check(t, a, request(bearer(old)...), "acme", "")
		if n := srv.hits.Load(); n != 2 {
			t.Fatalf("%d fetches, want 2", n)
		}
	})
	t.Run("another unknown kid right after", func(t *testing.T) {
		tok := sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-3", goodClaims("beta"))
		check(t, a, request(bearer(tok)...), "", auth.ReasonUnknownKID)
		if n := srv.hits.Load(); n != 2 {
			t.Fatalf("%d fetches, want 2", n)
		}
	})
	// Many requests with unknown kids at once: one fetch serves them all.
	t.Run("concurrent unknown kids fetch once", func(t *testing.T) {
		clock.Advance(time.Minute)
		srv.setKeys(t, jwk(rsaKey1(), "rsa-1", "RS256"), jwk(rsaKey2(), "rsa-2", "RS256"), jwk(rsaKey2(), "rsa-4", "RS256"))
		tok := sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-4", goodClaims("beta"))
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for range 32 {
			wg.Go(func() {
				if _, err := a.Authenticate(request(bearer(tok)...)); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n := srv.hits.Load(); n != 3 {
			t.Fatalf("%d fetches, want 3", n)
		}
	})
	if got := refreshes(t, reg, "unknown_kid", "ok"); got != 2 {
		t.Errorf("unknown_kid refreshes = %v, want 2", got)
	}
	if got := promtest.Value(t, reg, "kvgate_auth_jwks_keys"); got != 3 {
		t.Errorf("kvgate_auth_jwks_keys = %v, want 3", got)
	}
}

// When the JWKS server fails, tokens signed by the keys already loaded keep
// working.
func TestJWKSFailureKeepsLastGoodSet(t *testing.T) {
	tests := []struct {
		name   string
		breakf func(*jwksServer)
		result string
	}{
		{name: "server down", breakf: func(s *jwksServer) { s.Close() }, result: "fetch_error"},
		{name: "server hangs", breakf: func(s *jwksServer) { s.setHang() }, result: "fetch_error"},
		{name: "status 500", breakf: func(s *jwksServer) { s.setBody(http.StatusInternalServerError, []byte("oops")) }, result: "fetch_error"},
		{name: "not json", breakf: func(s *jwksServer) { s.setBody(http.StatusOK, []byte("<html>")) }, result: "invalid"},
		{name: "no keys", breakf: func(s *jwksServer) { s.setBody(http.StatusOK, []byte(`{"keys":[]}`)) }, result: "invalid"},
		{name: "only unusable keys", breakf: func(s *jwksServer) {
			s.setBody(http.StatusOK, []byte(`{"keys":[{"kty":"oct","kid":"rsa-1","k":"c2VjcmV0"}]}`))
		}, result: "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newJWKSServer(t, jwk(rsaKey1(), "rsa-1", "RS256"))
			clock := newClock()
			jc := jwtConfig(srv)
			jc.FetchTimeout = dur(200 * time.Millisecond)
			a, reg := newAuth(t, &v1alpha1.AuthSpec{JWT: jc}, clock)
			good := sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", goodClaims("acme"))
			check(t, a, request(bearer(good)...), "acme", "")

			tt.breakf(srv)
			clock.Advance(time.Minute)
			// An unknown kid makes it fetch, which fails.
			unknown := sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-2", goodClaims("beta"))
			check(t, a, request(bearer(unknown)...), "", auth.ReasonUnknownKID)
			if got := refreshes(t, reg, "unknown_kid", tt.result); got != 1 {
				t.Fatalf("unknown_kid/%s refreshes = %v, want 1", tt.result, got)
			}
			check(t, a, request(bearer(good)...), "acme", "")
			if err := a.Ready(); err != nil {
				t.Errorf("Ready: %v", err)
			}
		})
	}
}

// The periodic refresh picks up a rotation without any token asking for it,
// and drops keys the provider no longer publishes.
func TestJWKSPeriodicRefresh(t *testing.T) {
	t.Parallel()
	srv := newJWKSServer(t, jwk(rsaKey1(), "rsa-1", "RS256"))
	jc := jwtConfig(srv)
	jc.RefreshInterval = dur(time.Second)
	// The fake clock stands still, so no unknown kid can force a fetch: only
	// the periodic refresh can load rsa-2.
	a, reg := newAuth(t, &v1alpha1.AuthSpec{JWT: jc}, newClock())
	srv.setKeys(t, jwk(rsaKey2(), "rsa-2", "RS256"))

	deadline := time.Now().Add(10 * time.Second)
	for refreshes(t, reg, "periodic", "ok") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no periodic refresh within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	check(t, a, request(bearer(sign(t, jwt.SigningMethodRS256, rsaKey2(), "rsa-2", goodClaims("beta")))...), "beta", "")
	check(t, a, request(bearer(sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", goodClaims("acme")))...), "", auth.ReasonUnknownKID)
	if got := promtest.Value(t, reg, "kvgate_auth_jwks_last_success_timestamp_seconds"); got == 0 {
		t.Error("last success timestamp not set")
	}
}

// An identity provider down at startup does not stop the Authenticator: API
// keys work, JWTs are refused until the JWKS loads, and Ready says why.
func TestJWKSUnavailableAtStartup(t *testing.T) {
	srv := newJWKSServer(t)
	srv.setBody(http.StatusServiceUnavailable, nil)
	clock := newClock()
	cfg := apiKeyConfig()
	cfg.JWT = jwtConfig(srv)
	a, reg := newAuth(t, cfg, clock)
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("Ready = %v, want the fetch's status", err)
	}
	if got := refreshes(t, reg, "startup", "fetch_error"); got != 1 {
		t.Fatalf("startup fetch_error = %v, want 1", got)
	}
	check(t, a, request("api-key", keyAcme), "acme", "")
	tok := sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", goodClaims("acme"))
	ae := mustFail(t, a, request(bearer(tok)...), auth.ReasonUnknownKID)
	if ae.Message() != "Invalid token: signing keys unavailable." {
		t.Errorf("message %q", ae.Message())
	}

	srv.setKeys(t, jwk(rsaKey1(), "rsa-1", "RS256"))
	clock.Advance(31 * time.Second)
	check(t, a, request(bearer(tok)...), "acme", "")
	if err := a.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
}

// Keys that cannot or must not verify tokens are skipped, not fatal.
func TestJWKSUnusableKeysSkipped(t *testing.T) {
	weak := mustRSA(1024)
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	keys := []any{
		jwk(rsaKey1(), "good", "RS256"),
		jwk(weak, "weak", "RS256"),
		jose.JSONWebKey{Key: rsaKey2().Public(), KeyID: "enc", Use: "enc"},
		jose.JSONWebKey{Key: secret, KeyID: "oct", Algorithm: "HS256"},
		jose.JSONWebKey{Key: rsaKey2(), KeyID: "private", Algorithm: "RS256"},
		map[string]any{"kty": "XYZ", "kid": "future"},
	}
	body, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	srv := newJWKSServer(t)
	srv.setBody(http.StatusOK, body)
	logs := &logtest.Buffer{}
	a, err := auth.New(context.Background(), &v1alpha1.AuthSpec{JWT: jwtConfig(srv)}, auth.Options{
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: newClock().Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	tests := []struct {
		name       string
		token      string
		wantReason auth.Reason
	}{
		{name: "good key", token: sign(t, jwt.SigningMethodRS256, rsaKey1(), "good", goodClaims("acme"))},
		{name: "1024-bit key", token: sign(t, jwt.SigningMethodRS256, weak, "weak", goodClaims("acme")), wantReason: auth.ReasonUnknownKID},
		{name: "encryption key", token: sign(t, jwt.SigningMethodRS256, rsaKey2(), "enc", goodClaims("acme")), wantReason: auth.ReasonUnknownKID},
		{name: "published private key", token: sign(t, jwt.SigningMethodRS256, rsaKey2(), "private", goodClaims("acme")), wantReason: auth.ReasonUnknownKID},
		{name: "published secret", token: sign(t, jwt.SigningMethodHS256, secret, "oct", goodClaims("acme")), wantReason: auth.ReasonUnsupportedAlg},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := "acme"
			if tt.wantReason != "" {
				want = ""
			}
			check(t, a, request(bearer(tt.token)...), want, tt.wantReason)
		})
	}
	l := logs.String()
	for _, want := range []string{"JWKS key skipped", `kid \"weak\"`, `kid \"private\"`, `kid \"oct\"`, `kid \"enc\"`, "key 5:"} {
		if !strings.Contains(l, want) {
			t.Errorf("logs lack %s:\n%s", want, l)
		}
	}
}

// Close ends the refresh loop; a second Close is harmless.
func TestClose(t *testing.T) {
	srv := newJWKSServer(t, jwk(rsaKey1(), "rsa-1", "RS256"))
	a, err := auth.New(context.Background(), &v1alpha1.AuthSpec{JWT: jwtConfig(srv)}, auth.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		a.Close()
		a.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
}

// A JWKS URL's password and query (a signed URL's token) stay out of what the
// authenticator reports when the fetch fails before any answer.
func TestJWKSFetchErrorRedacted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens: the fetch fails with the client's error
	cfg := apiKeyConfig()
	cfg.JWT = &v1alpha1.JWTSpec{JWKSURI: "http://user:s3cret@" + addr + "/jwks?sig=t0ken", Issuer: testIssuer, Audiences: []string{testAudience}}
	a, _ := newAuth(t, cfg, newClock())
	err = a.Ready()
	if err == nil {
		t.Fatal("Ready: nil, want the failed fetch")
	}
	for _, secret := range []string{"s3cret", "t0ken"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Ready = %q, shows %q", err, secret)
		}
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("Ready = %q, want the host named", err)
	}
}
