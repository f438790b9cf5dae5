package global

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestMemberHealth: the heartbeat, draining, ejection and ramp rules, on a
// clock the test controls.
func TestMemberHealth(t *testing.T) {
	s := settings{heartbeatTimeout: 2 * time.Second, rampUp: 10 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	up := route.Summary{Models: []route.ModelSummary{{Model: llama, ReadyEndpoints: 1}}}
	m := newMember(Member{Name: "a"})
	m.born = t0
	if m.evaluate(t0, s).healthy {
		t.Fatal("healthy before any heartbeat")
	}
	m.heartbeat(t0, up, nil)
	if v := m.evaluate(t0, s); !v.healthy || v.ramp != 1 {
		t.Fatalf("found at start: %+v, want healthy at full share", v)
	}
	if m.evaluate(t0.Add(2100*time.Millisecond), s).healthy {
		t.Fatal("healthy with a heartbeat older than the timeout")
	}
	back := t0.Add(5 * time.Second)
	m.heartbeat(back, up, nil)
	for _, tc := range []struct {
		after time.Duration
		ramp  float64
	}{{0, 0.1}, {5 * time.Second, 0.55}, {10 * time.Second, 1}, {time.Minute, 1}} {
		m.heartbeat(back.Add(tc.after), up, nil)
		if v := m.evaluate(back.Add(tc.after), s); !v.healthy || v.ramp < tc.ramp-0.01 || v.ramp > tc.ramp+0.01 {
			t.Errorf("%v after its return: %+v, want ramp %.2f", tc.after, v, tc.ramp)
		}
	}
	now := back.Add(time.Minute)
	m.failed(now, true, s)
	if m.evaluate(now, s).healthy {
		t.Error("healthy right after a connection error")
	}
	m.heartbeat(now.Add(2*time.Second), up, nil)
	if v := m.evaluate(now.Add(2*time.Second), s); !v.healthy || v.ramp > 0.11 {
		t.Errorf("after the ejection: %+v, want healthy and ramping from 0.1", v)
	}
	for range 2 {
		m.failed(now.Add(3*time.Second), false, s)
	}
	if !m.evaluate(now.Add(3*time.Second), s).healthy {
		t.Error("two server errors ejected the member; three should")
	}
	m.failed(now.Add(3*time.Second), false, s)
	if m.evaluate(now.Add(3*time.Second), s).healthy {
		t.Error("three server errors in a row did not eject the member")
	}
	drain := up
	drain.Draining = true
	m.heartbeat(now.Add(10*time.Second), drain, nil)
	if m.evaluate(now.Add(10*time.Second), s).healthy {
		t.Error("a draining member is healthy")
	}

	late := newMember(Member{Name: "late"})
	late.born = t0
	late.heartbeat(t0.Add(time.Minute), up, nil)
	if v := late.evaluate(t0.Add(time.Minute), s); !v.healthy || v.ramp > 0.11 {
		t.Errorf("a member first seen a minute after start: %+v, want a ramp", v)
	}
}

// TestHeartbeatErrorRedacted: /debug/members shows why a member's heartbeat
// failed, naming its admin URL without the URL's password or query values (a
// signed URL's token travels there), however the heartbeat failed.
func TestHeartbeatErrorRedacted(t *testing.T) {
	const password, token = "admin-password", "sig-value"
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	serve := func(h http.HandlerFunc) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, tc := range []struct {
		name  string
		admin string // the member's admin server
		want  string // in the error shown
	}{
		{"unreachable", closed.URL, "connection refused"},
		{"status", serve(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no", http.StatusInternalServerError)
		}), "500 Internal Server Error"},
		{"not JSON", serve(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) }), "invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := strings.Replace(tc.admin, "http://", "http://gw:"+password+"@", 1) + "/?token=" + token
			cfg := routerConfig(Routing{HeartbeatInterval: d(20 * time.Millisecond), HeartbeatTimeout: d(time.Second)},
				Member{Name: "a", URL: "http://127.0.0.1:1", AdminURL: admin})
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			r := New(cfg, Options{Logger: quiet})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r.Start(ctx)
			var body string
			waittest.Until(t, 5*time.Second, "the heartbeat's error shown", func() bool {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/debug/members", nil)
				req.RemoteAddr, req.Host = "127.0.0.1:1", "localhost"
				r.AdminHandler().ServeHTTP(rec, req)
				body = rec.Body.String()
				return strings.Contains(body, `"LastError"`)
			})
			if strings.Contains(body, password) || strings.Contains(body, token) {
				t.Errorf("/debug/members shows a secret: %s", body)
			}
			if host := strings.TrimPrefix(tc.admin, "http://"); !strings.Contains(body, host) || !strings.Contains(body, tc.want) {
				t.Errorf("/debug/members does not say which URL failed (%s) and why (%s): %s", host, tc.want, body)
			}
		})
	}
}
