package global

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestReload: `kvgate global` reloads its file when it changes and on SIGHUP —
// a new member, a new price, rotated API keys — without failing a stream under
// way; a file that does not validate is reported on /debug/config while the
// previous configuration keeps serving.
func TestReload(t *testing.T) {
	a, b := startTier1(t, 1, simserver.Options{}), startTier1(t, 1, simserver.Options{})
	path := filepath.Join(t.TempDir(), "global.yaml")
	write := func(cfg *Config) {
		t.Helper()
		y, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Written aside and renamed, as editors and ConfigMaps do: the watcher
		// never reads half a file.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, y, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(k string) *v1alpha1.AuthSpec {
		return &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey(k)}}}
	}
	first := routerConfig(steadyRouting(), a.member("a", 1))
	first.Spec.Auth = keys("sk-old")
	write(first)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	// As the command runs it: the file read at start by Run itself.
	api, admin, done := runRouter(t, ctx, ServerOptions{ConfigPath: path, Reload: hup})
	debugConfig := func() (accepted bool, errText, active string) {
		resp, err := http.Get(admin + "/debug/config")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out struct {
			Accepted bool   `json:"lastReloadAccepted"`
			Err      string `json:"lastReloadError"`
			Active   string `json:"active"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Accepted, out.Err, out.Active
	}
	waittest.Until(t, 10*time.Second, "the member healthy", func() bool { resp, _ := send(t, api, "sk-old", chatBody("")); return resp.StatusCode == 200 })

	// A stream that runs through both reloads below.
	var streamed atomic.Int64
	streamDone := make(chan error, 1)
	streaming := make(chan struct{})
	go func() {
		req, _ := http.NewRequest("POST", api+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+llama+`","messages":[{"role":"user","content":"hi"}],"max_tokens":600,"ignore_eos":true,"stream":true}`))
		req.Header.Set("Authorization", "Bearer sk-old")
		resp, err := http.DefaultClient.Do(req)
		close(streaming)
		if err != nil {
			streamDone <- err
			return
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		streamed.Store(int64(strings.Count(string(body), "data: ")))
		if err == nil && (resp.StatusCode != 200 || !strings.Contains(string(body), "data: [DONE]")) {
			err = &streamError{resp.StatusCode, string(body)}
		}
		streamDone <- err
	}()

	<-streaming // admitted under the old key before it rotates
	// The file changes: b joins cheaper than a, a's price rises, the key rotates.
	second := routerConfig(steadyRouting(), a.member("a", 5), b.member("b", 1))
	second.Spec.Auth = keys("sk-new")
	write(second)
	waittest.Until(t, 10*time.Second, "the new configuration in force", func() bool {
		// The page shows no key hash: b's address marks the new file.
		ok, _, active := debugConfig()
		return ok && strings.Contains(active, b.adminAddr) && !strings.Contains(active, auth.HashKey("sk-new"))
	})
	select {
	case err := <-streamDone:
		t.Fatalf("the stream ended (%v) before the reload: it must run through it", err)
	default:
	}
	if resp, body := send(t, api, "sk-old", chatBody("")); resp.StatusCode != 401 {
		t.Fatalf("the rotated-out key: %d %s", resp.StatusCode, body)
	}
	waittest.Until(t, 10*time.Second, "the cheaper new member taking requests", func() bool {
		resp, _ := send(t, api, "sk-new", chatBody(""))
		return resp.StatusCode == 200 && resp.Header.Get("X-Kvgate-Member") == "b"
	})

	// An invalid file: rejected, reported, and the previous configuration serves.
	if err := os.WriteFile(path, []byte("apiVersion: "+APIVersion+"\nkind: "+Kind+"\nspec:\n  members: []\n  bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the invalid file reported", func() bool { ok, e, _ := debugConfig(); return !ok && strings.Contains(e, "bogus") })
	if resp, body := send(t, api, "sk-new", chatBody("")); resp.StatusCode != 200 {
		t.Fatalf("after an invalid file the previous configuration must serve: %d %s", resp.StatusCode, body)
	}

	// SIGHUP reads the file again even when unchanged: back to a valid one.
	write(second)
	waittest.Until(t, 10*time.Second, "the valid file accepted again", func() bool { ok, _, _ := debugConfig(); return ok })
	before := metricText(t, admin, `kvgate_global_config_reloads_total{result="success"}`)
	hup <- os.Interrupt
	waittest.Until(t, 10*time.Second, "a reload on SIGHUP", func() bool {
		return metricText(t, admin, `kvgate_global_config_reloads_total{result="success"}`) != before
	})

	select {
	case err := <-streamDone:
		if err != nil {
			t.Fatalf("the stream under way across the reloads: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream under way did not finish")
	}
	if n := streamed.Load(); n < 600 {
		t.Fatalf("the stream under way carried %d events, want all 600 tokens and [DONE]", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type streamError struct {
	code int
	body string
}

func (e *streamError) Error() string { return http.StatusText(e.code) + ": " + e.body }

// metricText returns the line of the admin listener's /metrics that starts
// with series.
func metricText(t testing.TB, admin, series string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, series) {
			return l
		}
	}
	return ""
}

// TestApplyKeepsMembers: a reload keeps a member's state (and its heartbeats)
// while its name and URLs stay, even when its price changes; a member whose
// URLs change starts afresh; a removed member's heartbeats stop.
func TestApplyKeepsMembers(t *testing.T) {
	a, b := startTier1(t, 1, simserver.Options{}), startTier1(t, 1, simserver.Options{})
	r, _ := startRouter(t, routerConfig(steadyRouting(), a.member("a", 1), b.member("b", 2)), Options{})
	old := r.gen.Load()
	ma, mb := old.members[0], old.members[1]

	moved := b.member("b", 2)
	moved.AdminURL = "http://" + a.adminAddr // same name, other URL: another cluster
	r.Apply(routerConfig(steadyRouting(), a.member("a", 3), moved), nil, nil, nil)
	g := r.gen.Load()
	if g.members[0] != ma || g.members[0].policy.Load().price != 3 {
		t.Fatalf("a: kept %v, price %v; want the same member at the new price 3", g.members[0] == ma, g.members[0].policy.Load().price)
	}
	if !g.members[0].evaluate(time.Now(), g.s).healthy {
		t.Fatal("a lost its health over a price change")
	}
	if g.members[1] == mb {
		t.Fatal("b with new URLs kept the old member's state")
	}
	if !old.retired.Load() {
		t.Fatal("the previous configuration was not retired")
	}

	// The b that replaced it is removed: its heartbeats stop (no request
	// holds the configuration it was in), its series go and stay gone.
	nb := g.members[1]
	waittest.Until(t, 10*time.Second, "the new b healthy", func() bool { return r.metric(t, "kvgate_global_member_healthy", "member", "b") == 1 })
	r.Apply(routerConfig(steadyRouting(), a.member("a", 3)), nil, nil, nil)
	waittest.Until(t, 10*time.Second, "the removed member's heartbeats stopped", func() bool {
		last := nb.evaluate(time.Now(), g.s).lastOK
		time.Sleep(300 * time.Millisecond) // three heartbeat intervals
		return nb.evaluate(time.Now(), g.s).lastOK.Equal(last)
	})
	if got := len(r.gen.Load().members); got != 1 {
		t.Fatalf("%d members after removing b, want 1", got)
	}
	r.observe(nb) // as a late failure of a request to it would
	for _, name := range []string{"kvgate_global_member_healthy", "kvgate_global_member_ramp"} {
		if r.hasSeries(t, name, "member", "b") {
			t.Errorf("the removed member's %s series came back", name)
		}
	}
}

// hasSeries says whether the router's registry has a series of the metric
// with the label set to value.
func (r *Router) hasSeries(t testing.TB, metric, label, value string) bool {
	t.Helper()
	fams, err := r.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != metric {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return true
				}
			}
		}
	}
	return false
}

// TestRemovedMemberFinishes: a request waiting for a member's first byte when a
// reload removes the member is answered by it, not given up on.
func TestRemovedMemberFinishes(t *testing.T) {
	slow := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(1500 * time.Millisecond): // past the heartbeat timeout
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	})
	other := startTier1(t, 1, simserver.Options{})
	r, base := startRouter(t, routerConfig(fastRouting(), slow.member("slow", 1), other.member("other", 5)), Options{})
	type result struct {
		code   int
		member string
	}
	done := make(chan result, 1)
	go func() {
		resp, _ := send(t, base, "", chatBody(""))
		done <- result{resp.StatusCode, resp.Header.Get("X-Kvgate-Member")}
	}()
	time.Sleep(200 * time.Millisecond)
	r.Apply(routerConfig(fastRouting(), other.member("other", 5)), nil, nil, nil)
	res := <-done
	if res.code != 200 || res.member != "slow" {
		t.Fatalf("the request under way: %d from %q, want 200 from the removed member", res.code, res.member)
	}
	if n := r.metric(t, "kvgate_global_failovers_total"); n != 0 {
		t.Fatalf("%v failovers: the removed member was given up on", n)
	}
}

// TestGenerationRetire: what a replaced configuration used is released once
// its last request ended and every older configuration's too — a dependency
// may be shared by several generations — and not before.
func TestGenerationRetire(t *testing.T) {
	cfg := func() *Config {
		return routerConfig(steadyRouting(), Member{Name: "a", URL: "http://127.0.0.1:1", AdminURL: "http://127.0.0.1:1"})
	}
	r := New(cfg(), Options{Logger: quiet})
	g1 := r.acquire() // a long stream under the first configuration
	var released []string
	var mu sync.Mutex
	rel := func(name string) func() {
		return func() { mu.Lock(); released = append(released, name); mu.Unlock() }
	}
	got := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(released) }
	r.Apply(cfg(), nil, nil, rel("after 1")) // retires generation 1
	g2 := r.acquire()
	if g2 == g1 {
		t.Fatal("a new request got the replaced configuration")
	}
	g2.release()                             // generation 2 idle at once
	r.Apply(cfg(), nil, nil, rel("after 2")) // retires generation 2, which shares with 1
	time.Sleep(50 * time.Millisecond)
	if l := got(); len(l) != 0 {
		t.Fatalf("released %v while a request of the first configuration still runs", l)
	}
	g1.release()
	waittest.Until(t, 10*time.Second, "both released", func() bool { return len(got()) == 2 })
	if l := got(); l[0] != "after 1" || l[1] != "after 2" {
		t.Fatalf("released in the order %v, want oldest first", l)
	}
}

// TestDepsReuse: a reload rebuilds the authenticator or the Redis limiter only
// when its part of the configuration changed, and releases the replaced one.
func TestDepsReuse(t *testing.T) {
	dp := newDeps(context.Background(), &Options{Logger: quiet})
	defer dp.close()
	cfg := func(key string, timeout time.Duration) *Config {
		c := routerConfig(steadyRouting(), Member{Name: "a", URL: "http://127.0.0.1:1", AdminURL: "http://127.0.0.1:1"})
		c.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey(key)}}}
		// Redis is dialled lazily: no server is needed to build the limiter.
		c.Spec.RateLimit = &RateLimit{Redis: "127.0.0.1:1", Timeout: d(timeout)}
		c.Spec.Tenants = []Tenant{{Name: "acme", Limits: []TenantLimit{{Model: "*", Limits: Limits{RequestsPerMinute: 5}}}}}
		return c
	}
	a1, l1, _, err := dp.build(cfg("k1", time.Second), false)
	if err != nil || a1 == nil || l1 == nil {
		t.Fatalf("first build: %v %v %v", a1, l1, err)
	}
	rl1 := dp.rl
	closed := 0
	closeRedis := dp.rlClose
	dp.rlClose = func() { closed++; closeRedis() }
	// defaultMaxTokens is read per request: no reason to reconnect to Redis.
	same := cfg("k1", time.Second)
	same.Spec.RateLimit.DefaultMaxTokens = new(int64(64))
	a2, _, retire, err := dp.build(same, true)
	if err != nil || a2 != a1 || dp.rl != rl1 {
		t.Fatalf("unchanged configuration rebuilt: auth kept %v, limiter kept %v, %v", a2 == a1, dp.rl == rl1, err)
	}
	retire()
	if closed != 0 {
		t.Fatal("a reload that kept the Redis client closed it")
	}
	if resp := authenticate(a2, "k1"); resp != "" {
		t.Fatalf("the kept authenticator no longer works: %s", resp)
	}
	a3, _, retire, err := dp.build(cfg("k2", 2*time.Second), true)
	if err != nil || a3 == a1 || dp.rl == rl1 {
		t.Fatalf("changed configuration not rebuilt: auth new %v, limiter new %v, %v", a3 != a1, dp.rl != rl1, err)
	}
	if authenticate(a3, "k1") == "" || authenticate(a3, "k2") != "" {
		t.Fatal("the rebuilt authenticator does not hold the new key only")
	}
	if closed != 0 {
		t.Fatal("the replaced Redis client closed before the old configuration retired")
	}
	retire()
	if closed != 1 {
		t.Fatalf("the replaced Redis client closed %d times on retirement, want 1", closed)
	}
	bad := cfg("k3", time.Second)
	bad.Spec.RateLimit.FailMode = "sideways"
	if _, _, _, err := dp.build(bad, true); err == nil {
		t.Fatal("an invalid fail mode built")
	}
	if dp.au != a3 {
		t.Fatal("a failed build replaced the authenticator in use")
	}
	// A JWT issuer unreachable at reload time: the reload is refused rather
	// than every token failing until it comes back.
	jwt := cfg("k2", 2*time.Second)
	jwt.Spec.Auth.JWT = &v1alpha1.JWTSpec{JWKSURI: "http://127.0.0.1:1/jwks.json", FetchTimeout: d(200 * time.Millisecond)}
	if _, _, _, err := dp.build(jwt, true); err == nil || dp.au != a3 {
		t.Fatalf("a reload whose JWKS cannot be loaded: err %v, authenticator replaced %v", err, dp.au != a3)
	}
}

// authenticate returns "" when key is accepted, else the error.
func authenticate(a *auth.Authenticator, key string) string {
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if _, err := a.Authenticate(req); err != nil {
		return err.Error()
	}
	return ""
}
