package global

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// startLimited runs routers (replicas) over one member with auth and limits
// kept in one Redis; it returns their URLs.
func startLimited(t testing.TB, member Member, redisAddr, failMode string, tenants []Tenant, replicas int) ([]*Router, []string) {
	t.Helper()
	return startLimitedLog(t, quiet, member, redisAddr, failMode, tenants, replicas)
}

// startLimitedLog is startLimited with the routers logging to log.
func startLimitedLog(t testing.TB, log *slog.Logger, member Member, redisAddr, failMode string, tenants []Tenant, replicas int) ([]*Router, []string) {
	t.Helper()
	// Heartbeats that tolerate a loaded machine: these tests are about limits,
	// and a member marked down would turn requests into 503s.
	cfg := routerConfig(Routing{HeartbeatInterval: d(200 * time.Millisecond), HeartbeatTimeout: d(10 * time.Second)}, member)
	cfg.Spec.Auth = &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey("sk-acme")}, {Tenant: "beta", Hash: auth.HashKey("sk-beta")}}}
	// A generous least wait for Redis: these tests are about what the limits
	// admit, on a machine that may be busy (CI runs packages side by side);
	// internal/ratelimit's TestSlowRedis covers short waits on a slow Redis.
	cfg.Spec.RateLimit = &RateLimit{Redis: redisAddr, FailMode: failMode, Timeout: d(5 * time.Second)}
	cfg.Spec.Tenants = tenants
	var routers []*Router
	var urls []string
	for range replicas {
		o := Options{Logger: log}
		closeDeps, err := Dependencies(context.Background(), cfg, &o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeDeps)
		r, u := startRouter(t, cfg, o)
		routers, urls = append(routers, r), append(urls, u)
	}
	return routers, urls
}

// send posts a chat request with an API key and returns the response, its body
// read.
func send(t testing.TB, base, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func chatBody(extra string) string {
	return `{"model":"` + llama + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4` + extra + `}`
}

// TestAuthAndRequestLimit: requests without a valid key get 401 with an OpenAI
// error; a tenant over its requests-per-minute gets 429 with Retry-After and
// x-ratelimit headers, while another tenant is unaffected.
func TestAuthAndRequestLimit(t *testing.T) {
	m := startTier1(t, 1, simserver.Options{})
	rd := redistest.Start(t)
	_, urls := startLimited(t, m.member("only", 1), rd.Addr(), "open", []Tenant{{Name: "acme", Limits: []TenantLimit{{Model: "*", Limits: Limits{RequestsPerMinute: 5}}}}}, 1)
	base := urls[0]
	for _, tc := range []struct{ name, key string }{{"no key", ""}, {"wrong key", "sk-nope"}} {
		resp, body := send(t, base, tc.key, chatBody(""))
		var e struct{ Error struct{ Code int } }
		if resp.StatusCode != 401 || json.Unmarshal(body, &e) != nil || e.Error.Code != 401 || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	for i := range 5 {
		if resp, body := send(t, base, "sk-acme", chatBody("")); resp.StatusCode != 200 {
			t.Fatalf("request %d within the limit: %d %s", i, resp.StatusCode, body)
		} else if resp.Header.Get("X-Ratelimit-Limit-Requests") != "5" || resp.Header.Get("X-Ratelimit-Remaining-Requests") != strconv.Itoa(4-i) {
			t.Errorf("request %d: limit %q remaining %q", i, resp.Header.Get("X-Ratelimit-Limit-Requests"), resp.Header.Get("X-Ratelimit-Remaining-Requests"))
		}
	}
	resp, body := send(t, base, "sk-acme", chatBody(""))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "rate_limit_error") {
		t.Fatalf("over the limit: %d retry-after %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, _ := send(t, base, "sk-beta", chatBody("")); resp.StatusCode != 200 {
		t.Fatalf("another tenant: %d", resp.StatusCode)
	}
}

// TestTokenReconcile: tokens are reserved from the prompt and max_tokens and
// settled with the real usage after the response — streamed with usage, or
// counted from the stream's events without it — so a tenant whose limit holds
// one reservation can send request after request that use few tokens.
func TestTokenReconcile(t *testing.T) {
	m := startTier1(t, 1, simserver.Options{})
	rd := redistest.Start(t)
	const tpm = 3000
	routers, urls := startLimited(t, m.member("only", 1), rd.Addr(), "closed", []Tenant{{Name: "acme", Limits: []TenantLimit{{Model: llama, Limits: Limits{TokensPerMinute: tpm}}}}}, 1)
	c := sdk(urls[0], option.WithAPIKey("sk-acme"))
	// The router settles a request after its last byte went out: the next
	// one waits for that, as a client's next request would not always.
	settled := func() float64 { return routers[0].metric(t, "kvgate_ratelimit_reconciled_tokens_total") }
	var used int64
	start := time.Now()
	for i, include := range []bool{true, false, true, false} {
		params := openai.ChatCompletionNewParams{Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(2000)}
		if include {
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		var remaining string
		s := c.Chat.Completions.NewStreaming(context.Background(), params, option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				remaining = resp.Header.Get("X-Ratelimit-Remaining-Tokens")
			}
			return resp, err
		}))
		before := settled()
		var events, usage int64
		for s.Next() {
			ch := s.Current()
			if len(ch.Choices) > 0 {
				events++
			}
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage.TotalTokens
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("request %d (2,000-token reservation, limit %d a minute): %v", i, tpm, err)
		}
		// What the reservation left: the limit less what earlier requests used
		// and this one reserved, plus what the minute gave back since the first
		// (tpm/60 a second). Without the earlier requests settled at their use,
		// two 2,000-token reservations would not fit under the limit at all.
		reserved := int64(len(`{"messages":[{"content":"hi","role":"user"}],"model":"`+llama+`","max_tokens":2000}`))/4 + 2000
		got, _ := strconv.ParseInt(remaining, 10, 64)
		low := tpm - used - reserved - 40
		high := min(tpm-reserved, low+int64(time.Since(start).Seconds()*tpm/60)) + 40
		if got < low || got > high {
			t.Errorf("request %d: remaining tokens %d, want %d..%d (used so far %d)", i, got, low, high, used)
		}
		if include {
			used += usage
		} else {
			// Without usage: the prompt's estimate and one token an event.
			used += int64(len(`{"messages":[{"content":"hi","role":"user"}],"model":"`+llama+`","max_tokens":2000,"stream":true}`))/4 + events
		}
		t.Logf("request %d: include_usage=%v, remaining after reserving %s, used %d in all", i, include, remaining, used)
		waittest.Until(t, 10*time.Second, "the request settled", func() bool { return settled() > before })
	}
}

// TestSharedLimitTwoReplicas: two router replicas, 250 requests/s offered in
// all, enforce one shared limit: what they admit together is within ±5% of the
// limit's allowance over the time they were admitting (replicas that did not
// share it would admit twice the burst), and every request is either admitted
// or refused with 429 — none gets 503 because a busy machine slowed Redis's
// answers. The rate is what a loaded 2-core machine running -race serves with
// room to spare: the test is about sharing, not throughput.
func TestSharedLimitTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("4 s of traffic at 250 requests/s")
	}
	// The member answers at once and notes when the admitted requests
	// reached it: the limiter's decisions come just before.
	var seenMu sync.Mutex
	var first, last time.Time
	f := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
		now := time.Now()
		seenMu.Lock()
		if first.IsZero() {
			first = now
		}
		last = now
		seenMu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	})
	rd := redistest.Start(t)
	const rpm = 300 // 5/s, and a burst of a minute's worth
	_, urls := startLimited(t, f.member("only", 1), rd.Addr(), "closed", []Tenant{{Name: "acme", Limits: []TenantLimit{{Model: "*", Limits: Limits{RequestsPerMinute: rpm}}}}}, 2)
	var admitted, refused, other atomic.Int64
	var codesMu sync.Mutex
	codes := map[string]int{}
	const rate, d = 250.0, 4 * time.Second
	start := time.Now()
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	body := chatBody("")
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if at.After(start.Add(d)) {
			break
		}
		time.Sleep(time.Until(at))
		wg.Go(func() {
			req, _ := http.NewRequest("POST", urls[i%2]+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-acme")
			resp, err := client.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				admitted.Add(1)
			case 429:
				refused.Add(1)
			default:
				other.Add(1)
				codesMu.Lock()
				codes[fmt.Sprintf("%d %.80s", resp.StatusCode, b)]++
				codesMu.Unlock()
			}
		})
	}
	offered := time.Since(start)
	wg.Wait()
	// GCRA's allowance: the burst (a minute's worth) plus the rate for the
	// span over which the limiter admitted — from the first admitted request
	// to the last, as the member saw them. On a busy machine requests reach
	// the limiter later than they were sent, so that span, not the time spent
	// offering, is what the limit is measured against.
	seenMu.Lock()
	span := last.Sub(first)
	seenMu.Unlock()
	allowance := float64(rpm) + float64(rpm)/60*span.Seconds()
	got := float64(admitted.Load())
	t.Logf("offered %d over %v; admitting for %v: admitted %d, refused %d, other %d; allowance %.0f (%+.1f%%)",
		admitted.Load()+refused.Load()+other.Load(), offered.Round(time.Millisecond), span.Round(time.Millisecond),
		admitted.Load(), refused.Load(), other.Load(), allowance, 100*(got/allowance-1))
	if other.Load() > 0 {
		t.Errorf("%d requests neither admitted nor refused with 429: %v", other.Load(), codes)
	}
	if got < allowance*0.95 || got > allowance*1.05 {
		t.Errorf("admitted %.0f, want %.0f ± 5%%", got, allowance)
	}
}

// TestRedisDown: with Redis killed, fail-open keeps admitting within a local
// limit and fail-closed refuses with 503; both recover when Redis returns.
func TestRedisDown(t *testing.T) {
	m := startTier1(t, 1, simserver.Options{})
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			rd := redistest.Start(t)
			var logs logtest.Buffer
			routers, urls := startLimitedLog(t, slog.New(slog.NewTextHandler(&logs, nil)), m.member("only", 1), rd.Addr(), mode,
				[]Tenant{{Name: "acme", Limits: []TenantLimit{{Model: "*", Limits: Limits{RequestsPerMinute: 3}}}}}, 1)
			if resp, _ := send(t, urls[0], "sk-acme", chatBody("")); resp.StatusCode != 200 {
				t.Fatalf("with Redis up: %d", resp.StatusCode)
			}
			rd.Kill()
			var codes []int
			for range 5 {
				resp, _ := send(t, urls[0], "sk-acme", chatBody(""))
				codes = append(codes, resp.StatusCode)
			}
			want := map[string][]int{"open": {200, 200, 200, 429, 429}, "closed": {503, 503, 503, 503, 503}}[mode]
			if fmt.Sprint(codes) != fmt.Sprint(want) {
				t.Errorf("with Redis down: %v, want %v (local limit of 3 when open)", codes, want)
			}
			// The outage is logged now and then, not once a request.
			if n := strings.Count(logs.String(), "level=WARN"); n > 2 {
				t.Errorf("%d warnings for 5 requests during the outage:\n%s", n, logs.String())
			}
			if mode == "open" {
				if n := routers[0].metric(t, "kvgate_ratelimit_degraded_decisions_total"); n < 5 {
					t.Errorf("degraded decisions counted %v", n)
				}
			}
			rd.Restart(t)
			waittest.Until(t, 10*time.Second, "Redis used again", func() bool {
				resp, _ := send(t, urls[0], "sk-acme", chatBody(""))
				return resp.StatusCode == 200 && routers[0].metric(t, "kvgate_ratelimit_redis_up") == 1
			})
			rec := httptest.NewRecorder()
			routers[0].AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			if !strings.Contains(rec.Body.String(), "kvgate_ratelimit_redis_errors_total") {
				t.Error("redis errors not in the metrics")
			}
		})
	}
}

// TestSlowDialToRedis: a Redis that is slow to accept connections, as a busy
// single-threaded one is when a burst dials many at once (its accept queue
// full, so the kernel drops the SYNs and the client resends them a second or
// more later), delays the limiter's decision but does not fail it: the
// request is admitted, not refused with 503.
func TestSlowDialToRedis(t *testing.T) {
	rd := redistest.Start(t)
	addr := slowAcceptProxy(t, rd.Addr(), 1500*time.Millisecond)
	f := startFake(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	})
	_, urls := startLimited(t, f.member("only", 1), addr, "closed", []Tenant{{Name: "acme", Limits: []TenantLimit{{Model: "*", Limits: Limits{RequestsPerMinute: 60}}}}}, 1)
	start := time.Now()
	resp, body := send(t, urls[0], "sk-acme", chatBody(""))
	if resp.StatusCode != 200 {
		t.Fatalf("after %v: %d %s", time.Since(start).Round(time.Millisecond), resp.StatusCode, body)
	}
	if n, err := rd.Client(t).Keys(context.Background(), "*").Result(); err != nil || len(n) == 0 {
		t.Errorf("Redis holds keys %v (%v): the decision was not Redis's", n, err)
	}
}

// slowAcceptProxy forwards connections to addr from a loopback listener whose
// accept queue holds one connection, filled at once, and which accepts none
// for the first wait: the SYNs of dials meanwhile are dropped, as by a server
// too busy to accept, and succeed only on the client's resend.
func slowAcceptProxy(t *testing.T, addr string, wait time.Duration) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	file := os.NewFile(uintptr(fd), "listener")
	defer func() { _ = file.Close() }()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // a backlog of 0 queues one
		t.Fatal(err)
	}
	ln, err := net.FileListener(file)
	if err != nil {
		t.Fatal(err)
	}
	filler, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); _ = filler.Close(); wg.Wait() })
	wg.Go(func() {
		time.Sleep(wait)
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { forward(in, addr) })
		}
	})
	return ln.Addr().String()
}

// forward copies between in and a new connection to addr until either side
// closes.
func forward(in net.Conn, addr string) {
	defer func() { _ = in.Close() }()
	out, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer func() { _ = out.Close() }()
	done := make(chan struct{}, 2)
	for _, p := range [][2]net.Conn{{out, in}, {in, out}} {
		go func() { _, _ = io.Copy(p[0], p[1]); done <- struct{}{} }()
	}
	<-done
}
