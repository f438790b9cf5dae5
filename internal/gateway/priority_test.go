package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestObjectivePriority: with the only endpoint at its limit, a request whose
// objective is sheddable (priority < 0) is refused at once with 429; of the
// requests waiting, the freed slot goes to the highest priority first,
// whatever their arrival order; the objective header does not reach the model
// server.
func TestObjectivePriority(t *testing.T) {
	var mu sync.Mutex
	var order, servedBefore []string
	var leaked []string
	release, stop := make(chan struct{}, 16), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		order = append(order, r.Header.Get("X-Who"))
		if v := r.Header.Get(proxy.ObjectiveHeader); v != "" {
			leaked = append(leaked, v)
		}
		mu.Unlock()
		select { // each request holds the endpoint until the test lets it go
		case <-release:
		case <-stop:
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	defer close(stop) // first: a failed test must not leave handlers holding srv.Close

	cfg := gatewayConfig(scheduler("p", "m", strings.TrimPrefix(srv.URL, "http://")))
	one, wait := int32(1), metav1.Duration{Duration: 10 * time.Second}
	cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &one, &wait
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}, {Name: "bulk", Priority: 0}}
	g, base := startGateway(t, cfg)

	type result struct {
		who  string
		code int
	}
	results := make(chan result, 16)
	send := func(who, objective string) {
		h := []string{"X-Who", who}
		if objective != "" {
			h = append(h, proxy.ObjectiveHeader, objective)
		}
		resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat("m"), h...)
		results <- result{who, resp.StatusCode}
	}
	go send("first", "")
	waittest.Until(t, 2*time.Second, "the first request holding the endpoint", func() bool { return counter(t, g, "kvgate_endpoint_in_flight") == 1 })

	start := time.Now()
	go send("shed", "batch")
	if r := <-results; r.who != "shed" || r.code != http.StatusTooManyRequests {
		t.Fatalf("the sheddable request: %+v, want 429", r)
	} else if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the sheddable request waited %v before its 429", took)
	}
	if counter(t, g, "kvgate_shed_total", "reason", "sheddable") != 1 {
		t.Error("the sheddable refusal is not counted")
	}

	// A high-priority request waits first, then five of priority 0 (without an
	// objective, or naming one not configured): the freed slot goes to the
	// high one whether the waiters are woken first-come or last-come.
	waiters := func() int { return g.Waiting() }
	go send("high-1", "chat")
	waittest.Until(t, 2*time.Second, "high-1 waiting", func() bool { return waiters() == 1 })
	for i := range 5 {
		objective := ""
		if i%2 == 1 {
			objective = "no-such-objective"
		}
		go send("low", objective)
		waittest.Until(t, 2*time.Second, "the low-priority requests waiting", func() bool { return waiters() == i+2 })
	}
	next := func(want string) {
		t.Helper()
		release <- struct{}{} // the request holding the endpoint ends
		if r := <-results; r.code != http.StatusOK {
			t.Fatalf("%s: %d", r.who, r.code)
		}
		waittest.Until(t, 2*time.Second, "the next request at the endpoint", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) >= 2 && order[len(order)-1] != "" && len(order) == len(servedBefore)+1
		})
		mu.Lock()
		got := order[len(order)-1]
		servedBefore = append(servedBefore, got)
		mu.Unlock()
		if got != want {
			t.Fatalf("served %q next, want %q (order so far %v)", got, want, servedBefore)
		}
	}
	servedBefore = []string{"first"}
	next("high-1")
	// Another important request arrives while the five still wait: it too
	// goes first.
	go send("high-2", "chat")
	waittest.Until(t, 2*time.Second, "high-2 waiting", func() bool { return waiters() == 6 })
	next("high-2")
	for range 5 {
		next("low")
	}
	release <- struct{}{}
	if r := <-results; r.code != http.StatusOK {
		t.Fatalf("%s: %d", r.who, r.code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) != 0 {
		t.Fatalf("the objective header reached the model server: %v", leaked)
	}
}

// TestObjectivePrioritySubset: a higher-priority request waiting for an
// endpoint it alone may use (the proxy's subset hint) holds back nobody from
// the other endpoints — neither a priority-0 request nor a sheddable one, which
// takes the free endpoint rather than a 429.
func TestObjectivePrioritySubset(t *testing.T) {
	const a, b = "127.0.0.1:1", "127.0.0.1:2"
	cfg := gatewayConfig(scheduler("p", "m", a, b))
	one, wait := int32(1), metav1.Duration{Duration: 5 * time.Second}
	cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &one, &wait
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}}
	g, _ := startGateway(t, cfg)
	ctx := context.Background()
	pick := func(objective string, subset ...string) (*route.Route, time.Duration) {
		t.Helper()
		start := time.Now()
		r, err := g.Route(ctx, route.Request{Model: "m", Objective: objective, Subset: subset})
		if err != nil {
			t.Fatalf("objective %q subset %v: %v", objective, subset, err)
		}
		return r, time.Since(start)
	}
	holdA, _ := pick("", a)
	high := make(chan *route.Route, 1)
	go func() { r, _ := pick("chat", a); high <- r }()
	waittest.Until(t, 2*time.Second, "the high-priority request waiting for a", func() bool { return g.Waiting() == 1 })

	low, took := pick("")
	if low.Served() != b || took > time.Second {
		t.Fatalf("priority 0 got %s after %v, want b at once", low.Served(), took)
	}
	low.Finish(route.Outcome{Status: http.StatusOK})
	shed, took := pick("batch")
	if shed.Served() != b || took > time.Second {
		t.Fatalf("sheddable got %s after %v, want b at once", shed.Served(), took)
	}
	shed.Finish(route.Outcome{Status: http.StatusOK})

	holdA.Finish(route.Outcome{Status: http.StatusOK})
	select {
	case r := <-high:
		if r.Served() != a {
			t.Fatalf("the high-priority request got %s, want a", r.Served())
		}
		r.Finish(route.Outcome{Status: http.StatusOK})
	case <-time.After(3 * time.Second):
		t.Fatal("the high-priority request was not given a when it freed")
	}
	if n := g.Waiting(); n != 0 {
		t.Fatalf("%d still registered as waiting", n)
	}
}

// BenchmarkObjectives: one simulated H100 behind the gateway, at most 16
// requests in flight and a 2 s queue timeout, offered more than it can serve:
// interactive and batch streams in equal numbers, open loop. Run side by side
// with every request at priority 0, then with objectives chat (10) and batch
// (-1). Reports the interactive requests' time to first byte, p50 and p99 (a
// 429 counts as the queue timeout, the least it cost), and the share of each
// class served.
func BenchmarkObjectives(b *testing.B) {
	_, addr := startSim(b, llama, simserver.Options{})
	const rate, seconds = 24, 8 // per class, per second
	for b.Loop() {
		for _, prio := range []bool{false, true} {
			cfg := gatewayConfig(scheduler("p", llama, addr))
			limit, wait := int32(16), metav1.Duration{Duration: 2 * time.Second}
			cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &limit, &wait
			if prio {
				cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "chat", Priority: 10}, {Name: "batch", Priority: -1}}
			}
			_, base := startGateway(b, cfg)
			type res struct {
				chat   bool
				ttfb   time.Duration
				served bool
			}
			var mu sync.Mutex
			var all []res
			var wg sync.WaitGroup
			start := time.Now()
			interval := time.Second / time.Duration(2*rate)
			for i := range 2 * rate * seconds {
				at := start.Add(time.Duration(i) * interval)
				time.Sleep(time.Until(at))
				chatReq := i%2 == 0
				wg.Go(func() {
					objective := "batch"
					if chatReq {
						objective = "chat"
					}
					req, _ := http.NewRequest("POST", base+"/v1/chat/completions",
						strings.NewReader(chat(llama, `"max_tokens":64`, `"ignore_eos":true`, `"stream":true`)))
					req.Header.Set(proxy.ObjectiveHeader, objective)
					resp, err := http.DefaultClient.Do(req)
					r := res{chat: chatReq}
					if err == nil {
						buf := make([]byte, 512)
						_, _ = resp.Body.Read(buf)
						r.ttfb, r.served = time.Since(at), resp.StatusCode == http.StatusOK
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
					}
					if !r.served {
						r.ttfb = max(r.ttfb, wait.Duration)
					}
					mu.Lock()
					all = append(all, r)
					mu.Unlock()
				})
			}
			wg.Wait()
			var chatTTFB []time.Duration
			served := map[bool]int{}
			for _, r := range all {
				if r.chat {
					chatTTFB = append(chatTTFB, r.ttfb)
				}
				if r.served {
					served[r.chat]++
				}
			}
			slices.Sort(chatTTFB)
			name := "equal"
			if prio {
				name = "objectives"
			}
			pct := func(p float64) float64 {
				return float64(chatTTFB[min(len(chatTTFB)-1, int(float64(len(chatTTFB))*p))]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(0.5), name+"-chat-ttfb-p50-ms")
			b.ReportMetric(pct(0.99), name+"-chat-ttfb-p99-ms")
			b.ReportMetric(100*float64(served[true])/float64(rate*seconds), name+"-chat-served-%")
			b.ReportMetric(100*float64(served[false])/float64(rate*seconds), name+"-batch-served-%")
		}
	}
}
