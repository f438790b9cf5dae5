package global

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/host"
)

// TestAdminPages: the admin listener guards /debug/config and /debug/members
// as kvgate serve's does — the same modes, the same redaction: with a token,
// the debug pages and /metrics want it and health does not; without a mode,
// only loopback clients read them; a Host that is not this machine's or an
// address is refused; pprof only when enabled; and no page shows a URL's
// password, a signed URL's query or an API key's hash.
func TestAdminPages(t *testing.T) {
	const (
		password = "member-password"
		signed   = "sig-value"
		keyHash  = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
		jwksPass = "jwks-password"
	)
	price := 1.0
	cfg := routerConfig(steadyRouting(), Member{Name: "a", URL: "http://gw:" + password + "@127.0.0.1:1", AdminURL: "http://127.0.0.1:2/?token=" + signed,
		PricePerMillionTokens: &price})
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "team-a", Hash: keyHash}},
		JWT: &v1alpha1.JWTSpec{Issuer: "https://issuer.example", JWKSURI: "https://svc:" + jwksPass + "@issuer.example/jwks"}}
	cfg.Metadata.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": keyHash}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(t *testing.T, o host.AdminOptions) (*Router, string) {
		r := New(cfg, Options{Logger: quiet, Admin: o})
		if r.adminErr != nil {
			t.Fatal(r.adminErr)
		}
		r.recordLoad(cfg, nil)
		srv := httptest.NewServer(r.AdminHandler())
		t.Cleanup(srv.Close)
		return r, srv.URL
	}
	get := func(t *testing.T, url, token, hostHeader string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if hostHeader != "" {
			req.Host = hostHeader
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type page struct {
		name, path, token, host string
		want                    int
	}
	check := func(t *testing.T, base string, pages []page) {
		for _, p := range pages {
			t.Run(p.name, func(t *testing.T) {
				code, body := get(t, base+p.path, p.token, p.host)
				if code != p.want {
					t.Fatalf("%s: %d, want %d: %.300s", p.path, code, p.want, body)
				}
				for _, secret := range []string{password, signed, keyHash, jwksPass} {
					if strings.Contains(body, secret) {
						t.Errorf("%s shows a secret (%s): %s", p.path, secret, body)
					}
				}
			})
		}
	}
	t.Run("token", func(t *testing.T) {
		_, base := serve(t, host.AdminOptions{Auth: host.AdminAuthToken, TokenFile: file, Metrics: true})
		check(t, base, []page{
			{"health without token", "/healthz", "", "", 200},
			{"metrics without token", "/metrics", "", "", 401},
			{"metrics with the token", "/metrics", "admin-token", "", 200},
			{"config without token", "/debug/config", "", "", 401},
			{"config with a wrong token", "/debug/config", "admin-toke", "", 401},
			{"config with the token", "/debug/config", "admin-token", "", 200},
			{"members without token", "/debug/members", "", "", 401},
			{"members with the token", "/debug/members", "admin-token", "", 200},
			{"a rebound name", "/debug/members", "admin-token", "attacker.example:9090", 403},
			{"pprof off by default", "/debug/pprof/", "admin-token", "", 404},
		})
	})
	t.Run("pprof when enabled", func(t *testing.T) {
		_, base := serve(t, host.AdminOptions{Auth: host.AdminAuthToken, TokenFile: file, Pprof: true})
		check(t, base, []page{
			{"without token", "/debug/pprof/", "", "", 401},
			{"with the token", "/debug/pprof/", "admin-token", "", 200},
		})
	})
	t.Run("none", func(t *testing.T) {
		r, base := serve(t, host.AdminOptions{})
		check(t, base, []page{
			{"config from loopback", "/debug/config", "", "", 200},
			{"members from loopback", "/debug/members", "", "", 200},
			{"a rebound name", "/debug/config", "", "attacker.example", 403},
		})
		// A client on the network: httptest.NewRequest comes from 192.0.2.1.
		for path, want := range map[string]int{"/debug/config": 403, "/debug/members": 403, "/metrics": 200, "/healthz": 200} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.Host = "10.0.0.7:9090"
			r.AdminHandler().ServeHTTP(rec, req)
			if rec.Code != want {
				t.Errorf("%s from the network: %d, want %d", path, rec.Code, want)
			}
		}
	})
	t.Run("options that do not hold", func(t *testing.T) {
		r := New(cfg, Options{Logger: quiet, Admin: host.AdminOptions{Auth: host.AdminAuthToken}})
		if r.adminErr == nil {
			t.Fatal("token mode without a token file accepted")
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/debug/config", nil)
		req.RemoteAddr, req.Host = "127.0.0.1:1", "localhost"
		r.AdminHandler().ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("/debug/config behind a broken gate: %d, want 503", rec.Code)
		}
	})
}
