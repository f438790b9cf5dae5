package global

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// fakeMember is a member whose API the test writes; its heartbeat reports one
// ready endpoint for llama until down is set.
type fakeMember struct {
	api, admin *httptest.Server
	down       atomic.Bool
}

func startFake(t testing.TB, api http.HandlerFunc) *fakeMember {
	t.Helper()
	f := &fakeMember{api: httptest.NewServer(api)}
	f.admin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if f.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(route.Summary{Time: time.Now(), Models: []route.ModelSummary{{Model: llama, ReadyEndpoints: 1, Endpoints: 1}}})
	}))
	t.Cleanup(func() {
		f.api.CloseClientConnections()
		f.api.Close()
		f.admin.Close()
	})
	return f
}

func (f *fakeMember) member(name string, price float64) Member {
	return Member{Name: name, URL: f.api.URL, AdminURL: f.admin.URL, PricePerMillionTokens: &price}
}

// recordingLimiter admits everything and records how each request settled.
type recordingLimiter struct {
	mu         sync.Mutex
	reconciled []int64
	cancelled  int
}

func (l *recordingLimiter) Admit(context.Context, string, string, int64) (Admission, error) {
	return Admission{Allowed: true, Headers: http.Header{},
		Reconcile: func(_ context.Context, used int64) {
			l.mu.Lock()
			l.reconciled = append(l.reconciled, used)
			l.mu.Unlock()
		},
		Cancel: func(context.Context) { l.mu.Lock(); l.cancelled++; l.mu.Unlock() },
	}, nil
}

func (l *recordingLimiter) settled() ([]int64, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.reconciled...), l.cancelled
}

// TestBadInput: malformed and hostile requests get an OpenAI error with the
// right status and never reach a member.
func TestBadInput(t *testing.T) {
	var reached atomic.Int64
	f := startFake(t, func(w http.ResponseWriter, _ *http.Request) { reached.Add(1) })
	cfg := routerConfig(steadyRouting(), f.member("only", 1))
	small := int64(1 << 10)
	cfg.Spec.Routing.MaxBodyBytes = &small
	_, base := startRouter(t, cfg, Options{})
	for _, tc := range []struct {
		name, method, path, body string
		header                   []string
		status                   int
		msg                      string
	}{
		{"bad JSON", "POST", "/v1/chat/completions", `{"model":`, nil, 400, "malformed JSON"},
		{"not an object", "POST", "/v1/chat/completions", `[1]`, nil, 400, "the body must be a JSON object"},
		{"model not a string", "POST", "/v1/chat/completions", `{"model":7}`, nil, 400, "'model' must be a string"},
		{"model not a string under the header", "POST", "/v1/chat/completions", `{"model":["` + llama + `"]}`, []string{"X-Gateway-Model-Name", llama}, 400, "'model' must be a string"},
		{"no model", "POST", "/v1/chat/completions", `{"messages":[]}`, nil, 400, "no matching model"},
		// Go's encoding/json would read the last key matching without regard
		// to case (MODEL); a Python server, the exact one (model).
		{"case variant", "POST", "/v1/chat/completions", `{"MODEL":"gpt-9","model":"` + llama + `"}`, nil, 400, `spelled "model", not "MODEL"`},
		{"case variant alone", "POST", "/v1/chat/completions", `{"Model":"` + llama + `"}`, nil, 400, `spelled "model", not "Model"`},
		{"duplicate", "POST", "/v1/chat/completions", `{"model":"gpt-9","model":"` + llama + `"}`, nil, 400, "more than once"},
		{"duplicate under the header", "POST", "/v1/chat/completions", `{"model":"` + llama + `","model":"` + llama + `"}`, []string{"X-Gateway-Model-Name", llama}, 400, "more than once"},
		{"header and body disagree", "POST", "/v1/chat/completions", `{"model":"sql-lora"}`, []string{"X-Gateway-Model-Name", llama},
			400, `the x-gateway-model-name header names model "` + llama + `" but the body names "sql-lora"`},
		{"header and a later body model disagree", "POST", "/v1/chat/completions", `{"messages":[],"model":"sql-lora"}`, []string{"X-Gateway-Model-Name", llama},
			400, `but the body names "sql-lora"`},
		{"max_tokens of the wrong type", "POST", "/v1/chat/completions", `{"model":"m","max_tokens":"lots"}`, nil, 400, "malformed JSON"},
		{"too large", "POST", "/v1/chat/completions", `{"model":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "exceeds 1024 bytes"},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9"}`, nil, 404, "no matching model"},
		{"wrong method", "GET", "/v1/chat/completions", ``, nil, 405, "not allowed"},
		{"unknown path", "POST", "/v1/nothing", `{}`, nil, 404, "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			for i := 0; i+1 < len(tc.header); i += 2 {
				req.Header.Set(tc.header[i], tc.header[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			var e struct {
				Error struct {
					Message string
					Code    int
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != tc.status || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("%d %+v (%v), want %d mentioning %q", resp.StatusCode, e, err, tc.status, tc.msg)
			}
		})
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d bad requests reached the member", n)
	}
}

// TestHungMember: a member that stops answering — its heartbeat goes, and the
// request it holds never gets a first byte — is given up on for the next one
// as soon as it is drained, not after the transport's timeout.
func TestHungMember(t *testing.T) {
	release := make(chan struct{})
	var hung *fakeMember
	hung = startFake(t, func(w http.ResponseWriter, r *http.Request) {
		hung.down.Store(true) // the cluster dies with the request in hand
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	good := startTier1(t, 1, simserver.Options{})
	lim := &recordingLimiter{}
	_, base := startRouter(t, routerConfig(fastRouting(), hung.member("hung", 1), good.member("good", 3)), Options{Limiter: lim})
	start := time.Now()
	var member string
	resp, body := send(t, base, "", chatBody(""))
	member = resp.Header.Get("X-Kvgate-Member")
	if resp.StatusCode != 200 || member != "good" {
		t.Fatalf("status %d from %q: %s", resp.StatusCode, member, body)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("failed over after %v; the heartbeat timeout is 600 ms", took)
	}
	if rec, cancelled := lim.settled(); len(rec) != 1 || cancelled != 0 {
		t.Errorf("settlements %v, cancels %d: want one reconcile", rec, cancelled)
	}
}

// TestSlowMember: a member whose heartbeat stays healthy but which does not
// start a stream — no headers at all, or headers and then no event — is given
// up on after routing.firstByteTimeout and the request served by the next
// member, without ejecting the slow one for a single timeout; with no other
// member the client gets a 504 OpenAI error, its reservation given back. A
// whole JSON answer, whose first byte comes with its last, is not bounded.
func TestSlowMember(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	hang := func(w http.ResponseWriter, r *http.Request, headers bool) {
		if headers {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	silent := startFake(t, func(w http.ResponseWriter, r *http.Request) { hang(w, r, false) })
	headersOnly := startFake(t, func(w http.ResponseWriter, r *http.Request) { hang(w, r, true) })
	good := startTier1(t, 1, simserver.Options{})
	routing := steadyRouting()
	routing.FirstByteTimeout = d(300 * time.Millisecond)
	stream := chatBody(`,"stream":true`)
	for _, tc := range []struct {
		name string
		slow *fakeMember
	}{{"no headers", silent}, {"headers, no body", headersOnly}} {
		t.Run(tc.name, func(t *testing.T) {
			lim := &recordingLimiter{}
			r, base := startRouter(t, routerConfig(routing, tc.slow.member("slow", 1), good.member("good", 3)), Options{Limiter: lim})
			start := time.Now()
			resp, body := send(t, base, "", stream)
			if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Member") != "good" || !strings.Contains(string(body), "[DONE]") {
				t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Member"), body)
			}
			if took := time.Since(start); took < 300*time.Millisecond || took > 5*time.Second {
				t.Errorf("served after %v; the first-byte timeout is 300 ms", took)
			}
			if r.metric(t, "kvgate_global_member_healthy", "member", "slow") != 1 {
				t.Error("one timeout ejected the slow member")
			}
			if rec, c := lim.settled(); len(rec) != 1 || c != 0 {
				t.Errorf("settled %v, cancels %d: want one reconcile", rec, c)
			}

			lim = &recordingLimiter{}
			_, base = startRouter(t, routerConfig(routing, tc.slow.member("slow", 1)), Options{Limiter: lim})
			resp, body = send(t, base, "", stream)
			var e struct {
				Error struct {
					Code    int
					Message string
				}
			}
			if resp.StatusCode != http.StatusGatewayTimeout || json.Unmarshal(body, &e) != nil || e.Error.Code != http.StatusGatewayTimeout {
				t.Fatalf("the only member silent: %d %s, want a 504 OpenAI error", resp.StatusCode, body)
			}
			// The client is told which bound fired, as tier 1 tells it.
			if want := "no first event within 300ms (firstByteTimeout)"; !strings.Contains(e.Error.Message, want) {
				t.Errorf("504 message %q, want it to name the bound: %q", e.Error.Message, want)
			}
			if rec, c := lim.settled(); len(rec) != 0 || c != 1 {
				t.Errorf("settled %v, cancels %d: want the reservation given back", rec, c)
			}
		})
	}
	t.Run("whole JSON answer slower than the timeout", func(t *testing.T) {
		slowJSON := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
			time.Sleep(600 * time.Millisecond) // generating the whole answer
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
		})
		r, base := startRouter(t, routerConfig(routing, slowJSON.member("slow", 1), good.member("good", 3)), Options{})
		resp, body := send(t, base, "", chatBody(""))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Member") != "slow" {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Member"), body)
		}
		if n := r.metric(t, "kvgate_global_failovers_total"); n != 0 {
			t.Fatalf("%v failovers for a JSON answer that took its time", n)
		}
	})
}

// TestSlowMemberEjected: a member ejected after three streams timed out keeps
// the requests it is about to answer — ejection stops new requests; only a lost
// heartbeat gives up on those it holds.
func TestSlowMemberEjected(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	slow := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "hang") {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		time.Sleep(250 * time.Millisecond) // answers within the timeout, after the ejection
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"))
	})
	good := startTier1(t, 1, simserver.Options{})
	routing := steadyRouting()
	routing.FirstByteTimeout = d(300 * time.Millisecond)
	routing.MaxAttempts = new(int32(1)) // a given-up request is not served elsewhere
	r, base := startRouter(t, routerConfig(routing, slow.member("slow", 1), good.member("good", 3)), Options{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _, _ = send(t, base, "", chatBody(`,"stream":true,"user":"hang"`)) })
	}
	time.Sleep(100 * time.Millisecond) // the three are with the member
	resp, body := send(t, base, "", chatBody(`,"stream":true`))
	wg.Wait()
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Member") != "slow" {
		t.Fatalf("the request the ejected member was answering: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Member"), body)
	}
	if r.metric(t, "kvgate_global_member_healthy", "member", "slow") != 0 {
		t.Error("three timeouts in a row did not eject the member")
	}
}

// TestRefusalsAndSettlement: a member's 429 (tier 1 saturated) and 5xx send
// the request to the next member without ejecting on the 429; a request no
// member served gives its reservation back; a JSON body that breaks mid-way
// cuts the client's connection and still settles.
func TestRefusalsAndSettlement(t *testing.T) {
	busy := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{}}`, http.StatusTooManyRequests)
	})
	broken := startFake(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusBadGateway) })
	cut := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		_, _ = w.Write([]byte(`{"id":"x","choices":[`))
		w.(http.Flusher).Flush() // the first bytes go out, then the member dies
		panic(http.ErrAbortHandler)
	})
	good := startTier1(t, 1, simserver.Options{})
	t.Run("429 then 502 then served", func(t *testing.T) {
		lim := &recordingLimiter{}
		r, base := startRouter(t, routerConfig(steadyRouting(), busy.member("busy", 1), broken.member("broken", 2), good.member("good", 3)), Options{Limiter: lim})
		resp, body := send(t, base, "", chatBody(""))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Member") != "good" {
			t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvgate-Member"), body)
		}
		if rec, c := lim.settled(); len(rec) != 1 || rec[0] <= 0 || c != 0 {
			t.Errorf("settled %v, cancels %d", rec, c)
		}
		if r.metric(t, "kvgate_global_member_healthy", "member", "busy") != 1 {
			t.Error("a 429 ejected the member")
		}
		if r.metric(t, "kvgate_global_failovers_total") != 2 {
			t.Errorf("failovers %v, want 2", r.metric(t, "kvgate_global_failovers_total"))
		}
	})
	t.Run("no member served", func(t *testing.T) {
		lim := &recordingLimiter{}
		_, base := startRouter(t, routerConfig(steadyRouting(), busy.member("busy", 1), broken.member("broken", 2)), Options{Limiter: lim})
		resp, body := send(t, base, "", chatBody(""))
		if resp.StatusCode != 502 || strings.Contains(string(body), "127.0.0.1") {
			t.Errorf("the last member's answer is relayed (%d), without internal addresses: %s", resp.StatusCode, body)
		}
		if rec, c := lim.settled(); len(rec)+c != 1 {
			t.Errorf("settled %v, cancels %d: want exactly one settlement", rec, c)
		}
	})
	t.Run("an error answer costs no tokens", func(t *testing.T) {
		bad := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"bad","code":400}}`, http.StatusBadRequest)
		})
		lim := &recordingLimiter{}
		_, base := startRouter(t, routerConfig(steadyRouting(), bad.member("bad", 1)), Options{Limiter: lim})
		if resp, _ := send(t, base, "", chatBody("")); resp.StatusCode != 400 {
			t.Fatalf("status %d, want the member's 400 relayed", resp.StatusCode)
		}
		if rec, c := lim.settled(); len(rec) != 1 || rec[0] != 0 || c != 0 {
			t.Errorf("settled %v, cancels %d: want one reconcile at 0 tokens", rec, c)
		}
	})
	t.Run("body cut mid-way", func(t *testing.T) {
		// A JSON answer is read whole before it is committed: one cut short
		// is a failed attempt, answered with a status, never a truncated body.
		lim := &recordingLimiter{}
		_, base := startRouter(t, routerConfig(steadyRouting(), cut.member("cut", 1)), Options{Limiter: lim})
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody("")))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := readAll(resp)
		if err != nil || resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(raw), `"error"`) || strings.Contains(string(raw), "127.0.0.1") {
			t.Fatalf("a member that cut its JSON answer: %d %s (%v)", resp.StatusCode, raw, err)
		}
		if got := resp.Header.Get("Retry-After"); got != "1" {
			t.Errorf("the 502 no member could serve: Retry-After %q, want 1 as tier 1's refusals", got)
		}
		waittest.Until(t, 10*time.Second, "the request settled", func() bool { rec, c := lim.settled(); return len(rec)+c == 1 })
	})
}

func readAll(resp *http.Response) ([]byte, error) {
	defer func() { _ = resp.Body.Close() }()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			if errors.Is(err, io.EOF) {
				return []byte(b.String()), nil
			}
			return []byte(b.String()), err
		}
	}
}

// TestRegion: equal prices, the member in the client's region takes the
// request: the region named by the header, else the router's own.
func TestRegion(t *testing.T) {
	east := startTier1(t, 1, simserver.Options{})
	west := startTier1(t, 1, simserver.Options{})
	me, mw := east.member("east", 1), west.member("west", 1)
	me.Region, mw.Region = "us-east-1", "us-west-2"
	routing := steadyRouting()
	routing.Region = "us-west-2"
	r, base := startRouter(t, routerConfig(routing, me, mw), Options{})
	for _, tc := range []struct{ header, want string }{{"us-east-1", "east"}, {"", "west"}} {
		for range 5 {
			// Each request after a heartbeat has counted the ones before: a
			// member's predicted TTFT grows with the requests sent since its
			// last heartbeat, and five inside one would spill the next to the
			// other region at random, by design (on a fast machine it did).
			waittest.Until(t, 10*time.Second, "a heartbeat since the last request", func() bool {
				for _, m := range r.gen.Load().members {
					if m.sent.Load() != 0 {
						return false
					}
				}
				return true
			})
			req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody("")))
			if tc.header != "" {
				req.Header.Set("X-Kvgate-Region", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if got := resp.Header.Get("X-Kvgate-Member"); got != tc.want {
				t.Fatalf("region header %q: served by %q, want %q", tc.header, got, tc.want)
			}
		}
	}
}

// TestHeaders: the client's credentials, hop-by-hop headers and kvgate's and
// the picker protocol's control headers do not reach the member (the model
// name does); tier 1's internals and the member's hop-by-hop headers do not
// reach the client.
func TestHeaders(t *testing.T) {
	var got http.Header
	var mu sync.Mutex
	f := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("X-Kvgate-Endpoint", "10.0.0.7:8000")
		w.Header().Set("X-Kvgate-Scores", "10.0.0.7:8000 0.9")
		// Hop-by-hop on the way back: the same policy as tier 1's.
		w.Header().Set("Connection", "X-Member-Hop")
		w.Header().Set("X-Member-Hop", "1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[]}`))
	})
	_, base := startRouter(t, routerConfig(steadyRouting(), f.member("only", 1)), Options{})
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody("")))
	for k, v := range map[string]string{"Authorization": "Bearer sk-secret", "Api-Key": "sk-secret", "Proxy-Authorization": "x",
		"X-Kvgate-Explain": "1", "X-Gateway-Destination-Endpoint": "10.0.0.9:8000", "X-Gateway-Model-Name": llama,
		"Connection": "X-Hop", "X-Hop": "1", "X-Custom": "kept"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	for _, h := range []string{"Authorization", "Api-Key", "Proxy-Authorization", "X-Kvgate-Explain", "X-Gateway-Destination-Endpoint", "X-Hop"} {
		if v := got.Get(h); v != "" {
			t.Errorf("%s reached the member: %q", h, v)
		}
	}
	if got.Get("X-Gateway-Model-Name") != llama || got.Get("X-Custom") != "kept" || got.Get("X-Request-Id") == "" || got.Get("X-Forwarded-For") == "" {
		t.Errorf("headers the member should get: %v", got)
	}
	if resp.Header.Get("X-Kvgate-Endpoint") != "" || resp.Header.Get("X-Kvgate-Scores") != "" || resp.Header.Get("X-Kvgate-Member") != "only" ||
		resp.Header.Get("X-Member-Hop") != "" || resp.Header.Get("Proxy-Authenticate") != "" {
		t.Errorf("response headers: %v", resp.Header)
	}
}

// TestTenantObjective: a tenant's configured objective reaches the member as
// x-gateway-inference-objective, whatever the client sent; a client's own
// objective never passes, so a tenant cannot raise its priority at tier 1.
func TestTenantObjective(t *testing.T) {
	var mu sync.Mutex
	var got []string
	f := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("X-Gateway-Inference-Objective"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[]}`))
	})
	au, err := auth.New(context.Background(), &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{
		{Tenant: "acme", Hash: auth.HashKey("sk-acme")}, {Tenant: "beta", Hash: auth.HashKey("sk-beta")}}}, auth.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg := routerConfig(steadyRouting(), f.member("only", 1))
	cfg.Spec.Tenants = []Tenant{{Name: "acme", Objective: "batch"}, {Name: "beta"}}
	_, base := startRouter(t, cfg, Options{Auth: au})
	for _, key := range []string{"sk-acme", "sk-beta"} {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody("")))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Gateway-Inference-Objective", "chat") // the client asks for more
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", key, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "batch" || got[1] != "" {
		t.Fatalf("objectives the member saw: %q, want [batch, none]", got)
	}
}

// TestStalledBody: a client that stops sending its body gets 408 once the
// body read timeout passes; an answer that takes longer than that timeout,
// its body long read, is not cut by it.
func TestStalledBody(t *testing.T) {
	f := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(600 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[]}`))
	})
	_, base := startRouter(t, routerConfig(steadyRouting(), f.member("only", 1)), Options{BodyReadTimeout: 300 * time.Millisecond})

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "did not arrive in time") {
		t.Errorf("stalled body: %d %s after %v", resp.StatusCode, b, time.Since(start))
	}

	resp2, body := send(t, base, "", chatBody(""))
	if resp2.StatusCode != 200 {
		t.Errorf("an answer slower than the body timeout: %d %s", resp2.StatusCode, body)
	}
}

// TestSilentMidStream: a member that starts a stream and then sends nothing
// (frozen after its first byte) is cut after routing.streamIdleTimeout with an
// explicit error event, instead of holding the client forever.
func TestSilentMidStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	silent := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	routing := steadyRouting()
	routing.StreamIdleTimeout = d(300 * time.Millisecond)
	_, base := startRouter(t, routerConfig(routing, silent.member("silent", 1)), Options{Limiter: &recordingLimiter{}})
	start := time.Now()
	resp, body := send(t, base, "", chatBody(`,"stream":true`))
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"code":504`) || !strings.Contains(string(body), "sent nothing") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
}
