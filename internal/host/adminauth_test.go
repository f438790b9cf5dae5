package host_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// adminGet reads path on the admin listener at base with a bearer token ("":
// none) and a Host header ("": the address's).
func adminGet(t *testing.T, base, path, token, hostHeader string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
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
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// adminCase is a request to the admin listener and the status it must get.
type adminCase struct {
	name, path, token, host string
	want                    int
}

func checkAdmin(t *testing.T, base string, cases []adminCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, header := adminGet(t, base, tc.path, tc.token, tc.host)
			if code != tc.want {
				t.Fatalf("%s: %d, want %d", tc.path, code, tc.want)
			}
			if code == http.StatusUnauthorized && header.Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate")
			}
		})
	}
}

// TestAdminToken: with a static token, /debug/* and /metrics want it (compared
// whole), health, /summary and the page's own files do not, pprof is not
// served unless enabled, a Host that is not this machine's, an address or a
// configured name is refused, and a rotated file takes effect without a
// restart.
func TestAdminToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config(scheduler("chat", llama, startSim(t, llama, simserver.Options{}).Addr()))
	admin := func(pprof bool) string {
		return start(t, cfg, host.CoreOptions{Admin: host.AdminOptions{Auth: host.AdminAuthToken, TokenFile: file,
			Metrics: true, Pprof: pprof, Hosts: []string{"kvgate-admin.ops.svc"}}}).AdminURL
	}
	base := admin(false)
	checkAdmin(t, base, []adminCase{
		{"health without token", "/healthz", "", "", 200},
		{"readiness without token", "/readyz", "", "", 200},
		{"summary without token", "/summary", "", "", 200},
		{"the page's files without token", "/ui/", "", "", 200},
		{"metrics without token", "/metrics", "", "", 401},
		{"metrics with the token", "/metrics", "first-token", "", 200},
		{"config without token", "/debug/config", "", "", 401},
		{"config with a wrong token", "/debug/config", "first-toke", "", 401},
		{"config with the token", "/debug/config", "first-token", "", 200},
		{"fleet with the token", "/debug/fleet", "first-token", "", 200},
		{"decisions without token", "/debug/decisions", "", "", 401},
		{"replicas without token", "/debug/replicas", "", "", 401},
		{"pprof off by default", "/debug/pprof/", "first-token", "", 404},
		{"a rebound name", "/debug/config", "first-token", "attacker.example:9090", 403},
		{"a rebound name on the page", "/ui/", "", "attacker.example", 403},
		{"a configured name", "/debug/config", "first-token", "kvgate-admin.ops.svc:9090", 200},
		{"localhost", "/debug/config", "first-token", "localhost:9090", 200},
		{"an IPv6 address", "/debug/config", "first-token", "[::1]:9090", 200},
	})
	t.Run("pprof when enabled", func(t *testing.T) {
		checkAdmin(t, admin(true), []adminCase{
			{"without token", "/debug/pprof/", "", "", 401},
			{"with the token", "/debug/pprof/", "first-token", "", 200},
		})
	})
	t.Run("a rotated token", func(t *testing.T) {
		if err := os.WriteFile(file, []byte("second-token"), 0o600); err != nil {
			t.Fatal(err)
		}
		waittest.Until(t, 5*time.Second, "the new token accepted", func() bool {
			code, _ := adminGet(t, base, "/debug/config", "second-token", "")
			return code == 200
		})
		if code, _ := adminGet(t, base, "/debug/config", "first-token", ""); code != 401 {
			t.Errorf("the old token after rotation: %d", code)
		}
	})
}

// TestAdminNoAuth: without an authentication mode the debug pages answer
// loopback clients only, under a Host check (a web page the local user opens
// could otherwise read them through a rebound name), while metrics and health
// answer everyone.
func TestAdminNoAuth(t *testing.T) {
	g := start(t, config(scheduler("chat", llama, startSim(t, llama, simserver.Options{}).Addr())), host.CoreOptions{})
	t.Run("loopback", func(t *testing.T) {
		checkAdmin(t, g.AdminURL, []adminCase{
			{"config", "/debug/config", "", "", 200},
			{"a rebound name", "/debug/config", "", "attacker.example:9090", 403},
			{"pprof off by default", "/debug/pprof/", "", "", 404},
		})
	})
	// A client on the network: httptest.NewRequest comes from 192.0.2.1.
	handler := g.AdminHandler()
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/debug/config", 403},
		{"/debug/fleet", 403},
		{"/debug/decisions", 403},
		{"/metrics", 200},
		{"/healthz", 200},
		{"/readyz", 200},
		{"/summary", 200},
		{"/ui/", 200},
	} {
		t.Run("from the network "+tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://10.0.0.7:9090"+tc.path, nil))
			if rec.Code != tc.want {
				t.Errorf("%d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
		})
	}
}
