package auth_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/promtest"
)

const (
	keyAcme = "sk-acme-0123456789"
	keyBeta = "sk-beta-9876543210"
)

func apiKeyConfig() *v1alpha1.AuthSpec {
	return &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{
		{Tenant: "acme", Hash: auth.HashKey(keyAcme)},
		{Tenant: "beta", Hash: auth.HashKey(keyBeta)},
	}}
}

func TestAPIKeys(t *testing.T) {
	a, reg := newAuth(t, apiKeyConfig(), nil)
	// A JWT-shaped bearer is an API key while JWT is not configured.
	jwtShaped := sign(t, jwt.SigningMethodRS256, rsaKey1(), "rsa-1", goodClaims("acme"))
	tests := []struct {
		name       string
		headers    []string
		wantTenant string
		wantReason auth.Reason
		wantMethod string // of the error, or of the identity
	}{
		{name: "bearer", headers: []string{"Authorization", "Bearer " + keyAcme}, wantTenant: "acme", wantMethod: auth.MethodAPIKey},
		{name: "api-key header", headers: []string{"api-key", keyBeta}, wantTenant: "beta", wantMethod: auth.MethodAPIKey},
		{name: "scheme case-insensitive", headers: []string{"Authorization", "bearer  " + keyAcme + " "}, wantTenant: "acme", wantMethod: auth.MethodAPIKey},
		{name: "bearer wins over api-key", headers: []string{"Authorization", "Bearer " + keyBeta, "api-key", keyAcme}, wantTenant: "beta", wantMethod: auth.MethodAPIKey},
		{name: "basic beside api-key", headers: []string{"Authorization", "Basic dXNlcjpwYXNz", "api-key", keyAcme}, wantTenant: "acme", wantMethod: auth.MethodAPIKey},
		{name: "wrong key", headers: []string{"Authorization", "Bearer sk-wrong"}, wantReason: auth.ReasonUnknownKey, wantMethod: auth.MethodAPIKey},
		{name: "wrong api-key", headers: []string{"api-key", keyAcme + "x"}, wantReason: auth.ReasonUnknownKey, wantMethod: auth.MethodAPIKey},
		{name: "jwt shaped", headers: bearer(jwtShaped), wantReason: auth.ReasonUnknownKey, wantMethod: auth.MethodAPIKey},
		{name: "missing", wantReason: auth.ReasonMissing},
		// Empty is wrong, not absent: it must not pass as anonymous.
		{name: "empty bearer", headers: []string{"Authorization", "Bearer "}, wantReason: auth.ReasonMalformed},
		{name: "empty api-key", headers: []string{"api-key", " "}, wantReason: auth.ReasonMalformed},
		{name: "basic", headers: []string{"Authorization", "Basic dXNlcjpwYXNz"}, wantReason: auth.ReasonMalformed},
		{name: "two authorization headers", headers: []string{"Authorization", "Bearer " + keyAcme, "Authorization", "Bearer " + keyBeta}, wantReason: auth.ReasonMalformed},
		{name: "two api-key headers", headers: []string{"api-key", keyAcme, "api-key", keyAcme}, wantReason: auth.ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(tt.headers...)
			if tt.wantReason == "" {
				if id := mustOK(t, a, r, tt.wantTenant); id.Method != tt.wantMethod {
					t.Errorf("method %q, want %q", id.Method, tt.wantMethod)
				}
				return
			}
			ae := mustFail(t, a, r, tt.wantReason)
			if ae.Method != tt.wantMethod {
				t.Errorf("error method %q, want %q", ae.Method, tt.wantMethod)
			}
			for i := 1; i < len(tt.headers); i += 2 {
				secret := strings.TrimSpace(strings.TrimPrefix(tt.headers[i], "Bearer "))
				if secret != "" && (strings.Contains(ae.Message(), secret) || strings.Contains(ae.Error(), secret)) {
					t.Errorf("error %q / %q echoes the credential", ae.Message(), ae.Error())
				}
			}
		})
	}
	for _, m := range []struct {
		method, result string
		want           float64
	}{
		{"api_key", "ok", 5}, {"api_key", "unknown_key", 3}, {"none", "missing", 1}, {"none", "malformed", 5},
	} {
		if got := promtest.Value(t, reg, "kvgate_auth_requests_total", "method", m.method, "result", m.result); got != m.want {
			t.Errorf("kvgate_auth_requests_total{method=%s,result=%s} = %v, want %v", m.method, m.result, got, m.want)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	for _, tt := range []struct {
		err  auth.Error
		want string
	}{
		{auth.Error{Reason: auth.ReasonMissing}, "Missing credentials: set Authorization: Bearer"},
		{auth.Error{Method: auth.MethodAPIKey, Reason: auth.ReasonUnknownKey}, "Incorrect API key provided."},
		{auth.Error{Method: auth.MethodJWT, Reason: auth.ReasonExpired, Detail: "expired"}, "Invalid token: expired."},
		{auth.Error{Reason: auth.ReasonMalformed, Detail: "unsupported Authorization scheme, use Bearer"}, "Invalid credentials: unsupported"},
	} {
		t.Run(string(tt.err.Reason), func(t *testing.T) {
			if got := tt.err.Message(); !strings.HasPrefix(got, tt.want) {
				t.Errorf("Message() = %q, want prefix %q", got, tt.want)
			}
			if tt.err.StatusCode() != http.StatusUnauthorized {
				t.Errorf("StatusCode() = %d", tt.err.StatusCode())
			}
		})
	}
}

func TestAnonymous(t *testing.T) {
	cfg := apiKeyConfig()
	cfg.AllowAnonymous = true
	a, _ := newAuth(t, cfg, nil)
	t.Run("no credentials", func(t *testing.T) {
		id := mustOK(t, a, request(), "")
		if id.Method != auth.MethodAnonymous {
			t.Fatalf("method %q", id.Method)
		}
	})
	t.Run("key still works", func(t *testing.T) {
		check(t, a, request("api-key", keyAcme), "acme", "")
	})
	// A wrong key is an error, not a fall-back to anonymous access.
	t.Run("wrong key refused", func(t *testing.T) {
		check(t, a, request(bearer("sk-nope")...), "", auth.ReasonUnknownKey)
	})
}

// TestMiddleware goes through a real HTTP server on loopback.
func TestMiddleware(t *testing.T) {
	logs := &logtest.Buffer{}
	reg := prometheus.NewRegistry()
	a, err := auth.New(context.Background(), apiKeyConfig(), auth.Options{
		Registerer: reg,
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := auth.FromContext(r.Context())
		if !ok {
			_, _ = io.WriteString(w, "open")
			return
		}
		_, _ = io.WriteString(w, id.Method+":"+id.Tenant)
	})
	srv := httptest.NewServer(a.Middleware(next, "/healthz", "/readyz"))
	defer srv.Close()

	tests := []struct {
		name      string
		path      string
		headers   []string
		status    int
		body      string // the body, or the error message's prefix
		challenge string
	}{
		{name: "healthz open", path: "/healthz", status: 200, body: "open"},
		{name: "readyz open", path: "/readyz", status: 200, body: "open"},
		{name: "open paths match exactly", path: "/healthz/", status: 401, body: "Missing credentials", challenge: `Bearer realm="kvgate"`},
		{name: "dot-dot not open", path: "/healthz/../v1/models", status: 401, body: "Missing credentials", challenge: `Bearer realm="kvgate"`},
		{name: "missing", path: "/v1/chat/completions", status: 401, body: "Missing credentials: set Authorization: Bearer", challenge: `Bearer realm="kvgate"`},
		{name: "wrong key", path: "/v1/chat/completions", headers: []string{"Authorization", "Bearer sk-secret-wrong"}, status: 401,
			body: "Incorrect API key provided.", challenge: `Bearer realm="kvgate", error="invalid_token"`},
		{name: "bearer", path: "/v1/chat/completions", headers: []string{"Authorization", "Bearer " + keyAcme}, status: 200, body: "api_key:acme"},
		{name: "api-key", path: "/v1/completions", headers: []string{"api-key", keyBeta}, status: 200, body: "api_key:beta"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(tt.headers); i += 2 {
				req.Header.Add(tt.headers[i], tt.headers[i+1])
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, tt.status, body)
			}
			if got := resp.Header.Get("WWW-Authenticate"); got != tt.challenge {
				t.Errorf("WWW-Authenticate %q, want %q", got, tt.challenge)
			}
			if tt.status == 200 {
				if string(body) != tt.body {
					t.Errorf("body %q, want %q", body, tt.body)
				}
				return
			}
			var eb openai.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if eb.Error.Type != openai.TypeInvalidRequest || eb.Error.Code != float64(401) || !strings.HasPrefix(eb.Error.Message, tt.body) {
				t.Errorf("error body %s, want invalid_request_error, code 401, message %q...", body, tt.body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	// Open paths are not counted; the six others are.
	if got := promtest.Value(t, reg, "kvgate_auth_requests_total"); got != 6 {
		t.Errorf("kvgate_auth_requests_total = %v, want 6", got)
	}
	// Refusals are logged at debug level, without the key.
	if l := logs.String(); !strings.Contains(l, "request not authenticated") || strings.Contains(l, "sk-secret-wrong") || strings.Contains(l, keyAcme) {
		t.Errorf("logs:\n%s", l)
	}
}

func TestWriteErrorOtherError(t *testing.T) {
	w := httptest.NewRecorder()
	auth.WriteError(w, io.EOF)
	if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("status %d, headers %v", w.Code, w.Header())
	}
}

func TestFromContextEmpty(t *testing.T) {
	if _, ok := auth.FromContext(context.Background()); ok {
		t.Fatal("identity in an empty context")
	}
	id := auth.Identity{Tenant: "t", Method: auth.MethodJWT}
	if got, ok := auth.FromContext(auth.NewContext(context.Background(), id)); !ok || got != id {
		t.Fatalf("FromContext = %+v, %v", got, ok)
	}
}

// A configuration reload builds a second Authenticator on the same registry;
// its counts continue the first one's.
func TestReregister(t *testing.T) {
	reg := prometheus.NewRegistry()
	for i := range 2 {
		a, err := auth.New(context.Background(), apiKeyConfig(), auth.Options{Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("New #%d: %v", i, err)
		}
		if _, err := a.Authenticate(request("api-key", keyAcme)); err != nil {
			t.Fatal(err)
		}
		a.Close()
	}
	if got := promtest.Value(t, reg, "kvgate_auth_requests_total", "method", "api_key", "result", "ok"); got != 2 {
		t.Fatalf("ok count %v, want 2", got)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	if _, err := auth.New(context.Background(), &v1alpha1.AuthSpec{}, auth.Options{}); err == nil {
		t.Fatal("New accepted an empty config")
	}
}
