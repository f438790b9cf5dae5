package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// The tests below put simulated model servers behind the gateway, load some of
// them directly (as other gateways or clients would), and assert where the
// gateway's requests go.

// post sends one request through the gateway and returns the endpoint that served
// it; it fails the test unless the answer is 200.
func post(t testing.TB, base, body string) string {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	return resp.Header.Get("X-Kvgate-Endpoint")
}

// burst sends n requests at once and counts where they went.
func burst(t testing.TB, base string, n int, body func(i int) string) map[string]int {
	t.Helper()
	var mu sync.Mutex
	served := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ep := post(t, base, body(i))
			mu.Lock()
			served[ep]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return served
}

// load sends n long requests straight to a server, bypassing the gateway, and
// returns a function that cancels them.
func load(t testing.TB, addr string, n int, body string) func() {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-done:
					cancel()
				case <-ctx.Done():
				}
			}()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	stop := sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

func sched(name, model, engine string, addrs ...string) v1alpha1.SchedulerSpec {
	sc := scheduler(name, model, addrs...)
	sc.EngineType = engine
	return sc
}

// TestLoadedEndpointGetsLessTraffic: an endpoint with a deep queue or a nearly
// full KV cache, read from each metric dialect, is passed over.
func TestLoadedEndpointGetsLessTraffic(t *testing.T) {
	long := strings.Repeat("Summarise the quarterly report in detail please. ", 240) // ~12k chars, ~1.6k tokens: a third of the cache each
	for _, tc := range []struct {
		name    string
		dialect simserver.Dialect
		engine  sim.Config
		// the direct load on the busy server
		n    int
		body string
		// what the fleet must show of busy before the gateway's requests go out
		ready func(waiting, kv float64) bool
	}{
		{"deep queue, vllm", simserver.DialectVLLM, sim.Config{MaxNumSeqs: 1}, 4, chat(llama, `"max_tokens":20000`, `"ignore_eos":true`),
			func(w, _ float64) bool { return w >= 3 }},
		{"deep queue, sglang", simserver.DialectSGLang, sim.Config{MaxNumSeqs: 1}, 4, chat(llama, `"max_tokens":20000`, `"ignore_eos":true`),
			func(w, _ float64) bool { return w >= 3 }},
		{"deep queue, trtllm", simserver.DialectTRTLLM, sim.Config{MaxNumSeqs: 1}, 4, chat(llama, `"max_tokens":20000`, `"ignore_eos":true`),
			func(w, _ float64) bool { return w >= 3 }},
		{"full KV cache, vllm", simserver.DialectVLLM, sim.Config{NumGPUBlocks: 300}, 2,
			`{"model":"` + llama + `","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1500,"ignore_eos":true}`,
			func(_, kv float64) bool { return kv >= 0.6 }},
		{"full KV cache, sglang", simserver.DialectSGLang, sim.Config{NumGPUBlocks: 300}, 2,
			`{"model":"` + llama + `","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1500,"ignore_eos":true}`,
			func(_, kv float64) bool { return kv >= 0.6 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.engine
			cfg.GPU, cfg.ModelSize = "h100", "8b"
			opts := simserver.Options{Dialect: tc.dialect, Engine: cfg}
			_, busy := startSim(t, llama, opts)
			_, idle := startSim(t, llama, opts)
			g, base := startGateway(t, gatewayConfig(sched("p", llama, string(tc.dialect), busy, idle)))
			stop := load(t, busy, tc.n, tc.body)
			defer stop()
			waittest.Until(t, 10*time.Second, "the load to show in busy's metrics", func() bool {
				s := g.Snapshot([]string{busy})[0]
				return s.Scraped && string(s.Dialect) == string(tc.dialect) && tc.ready(s.Waiting, s.KVUsage)
			})
			served := map[string]int{}
			for range 12 {
				served[post(t, base, chat(llama))]++
			}
			if served[busy] > 2 || served[idle] < 10 {
				t.Fatalf("busy served %d of 12, idle %d", served[busy], served[idle])
			}
		})
	}
}

// TestAdapterGoesToItsHolder: a request for a LoRA adapter goes to the pod running
// it rather than to an equally loaded pod that would have to load it, and never to
// a pod with no slot for it.
func TestAdapterGoesToItsHolder(t *testing.T) {
	opts := simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxLoRAs: 1}, LoRAModules: []string{"sql-lora", "chat-lora"}}
	_, holder := startSim(t, llama, opts)
	_, other := startSim(t, llama, opts)
	_, full := startSim(t, llama, opts)
	sc := scheduler("p", llama, holder, other, full)
	sc.LoRAAdapters = []string{"sql-lora", "chat-lora"}
	g, base := startGateway(t, gatewayConfig(sc))
	// The same load everywhere: one long request each; holder runs sql-lora, full
	// runs chat-lora in its only slot, other runs the base model.
	long := func(model string) string { return chat(model, `"max_tokens":20000`, `"ignore_eos":true`) }
	load(t, holder, 1, long("sql-lora"))
	load(t, other, 1, long(llama))
	load(t, full, 1, long("chat-lora"))
	waittest.Until(t, 10*time.Second, "adapters to show in metrics", func() bool {
		s := g.Snapshot([]string{holder, other, full})
		return len(s[0].RunningAdapters) == 1 && s[1].Running == 1 && len(s[2].RunningAdapters) == 1
	})
	served := map[string]int{}
	for range 10 {
		served[post(t, base, chat("sql-lora"))]++
	}
	if served[holder] < 9 || served[full] != 0 {
		t.Fatalf("sql-lora requests: holder %d, other %d, full %d", served[holder], served[other], served[full])
	}
}

// TestPrefixAffinity: requests sharing a long system prompt stick to one endpoint
// until its load makes another better, and then stick to that one.
func TestPrefixAffinity(t *testing.T) {
	opts := simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 2}}
	var addrs []string
	for range 3 {
		_, a := startSim(t, llama, opts)
		addrs = append(addrs, a)
	}
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, addrs...)))
	system := strings.Repeat("You are the support assistant of Example Corp. Follow the policy below. ", 60)
	ask := func(i int) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}],"max_tokens":2}`, llama, system, i)
	}
	waittest.Until(t, 5*time.Second, "endpoints scraped", func() bool {
		for _, s := range g.Snapshot(addrs) {
			if !s.Scraped {
				return false
			}
		}
		return true
	})
	served := map[string]int{}
	for i := range 10 {
		served[post(t, base, ask(i))]++
	}
	first := ""
	for a, n := range served {
		if n >= 9 {
			first = a
		}
	}
	if first == "" {
		t.Fatalf("shared-prefix requests spread: %v", served)
	}
	if got := counter(t, g, "kvgate_prefix_match_ratio"); got != 10 {
		t.Errorf("prefix match observations %v, want 10", got)
	}
	// A deep queue on the holder (saturated at 5 waiting) makes another endpoint
	// better; the group moves there and sticks again.
	load(t, first, 7, chat(llama, `"max_tokens":20000`, `"ignore_eos":true`))
	waittest.Until(t, 10*time.Second, "the holder's queue to show", func() bool { return g.Snapshot([]string{first})[0].Waiting >= 5 })
	served = map[string]int{}
	for i := range 10 {
		served[post(t, base, ask(100+i))]++
	}
	if served[first] > 0 || len(served) != 1 {
		t.Fatalf("after loading the holder: %v (holder %s)", served, first)
	}
	if counter(t, g, "kvgate_prefix_index_blocks") == 0 {
		t.Error("prefix index reports no blocks")
	}
}

// TestBurstSpreads: 200 requests arriving between two scrapes spread over the
// pool instead of herding onto the endpoint that looked idlest at the last one.
func TestBurstSpreads(t *testing.T) {
	var addrs []string
	for range 4 {
		_, a := startSim(t, llama, simserver.Options{})
		addrs = append(addrs, a)
	}
	cfg := gatewayConfig(scheduler("p", llama, addrs...))
	cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{Interval: &metav1.Duration{Duration: 10 * time.Second}, StaleAfter: &metav1.Duration{Duration: time.Minute}}
	g, base := startGateway(t, cfg)
	waittest.Until(t, 5*time.Second, "the first scrape", func() bool {
		for _, s := range g.Snapshot(addrs) {
			if !s.Scraped {
				return false
			}
		}
		return true
	})
	// Long enough that none ends while the burst is still being sent, even on a
	// loaded machine: the spread must come from counting dispatches, not from
	// endpoints freeing up.
	served := burst(t, base, 200, func(int) string { return chat(llama, `"max_tokens":200`, `"ignore_eos":true`) })
	for _, a := range addrs {
		if served[a] < 25 {
			t.Fatalf("burst of 200 over 4 endpoints: %v", served)
		}
	}
}

// TestStaleEndpoints: an endpoint whose metrics stopped coming is avoided while
// others are fresh; when all are stale the picker fails open and keeps serving.
func TestStaleEndpoints(t *testing.T) {
	a, addrA := startSim(t, llama, simserver.Options{})
	b, addrB := startSim(t, llama, simserver.Options{})
	cfg := gatewayConfig(scheduler("p", llama, addrA, addrB))
	// Failed scrapes would soon make the endpoint unhealthy; this test is about
	// staleness alone.
	hundred := int32(100)
	cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{StaleAfter: &metav1.Duration{Duration: 300 * time.Millisecond}, UnhealthyAfter: &hundred}
	g, base := startGateway(t, cfg)
	waittest.Until(t, 5*time.Second, "both scraped", func() bool {
		s := g.Snapshot([]string{addrA, addrB})
		return s[0].Scraped && s[1].Scraped
	})
	if err := a.SetFaults(simserver.Faults{MetricsErrorStatus: 500}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "a stale", func() bool {
		s := g.Snapshot([]string{addrA})[0]
		return s.Stale && s.Healthy
	})
	served := burst(t, base, 20, func(int) string { return chat(llama) })
	if served[addrA] != 0 || served[addrB] != 20 {
		t.Fatalf("with a stale: %v", served)
	}
	if err := b.SetFaults(simserver.Faults{MetricsErrorStatus: 500}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "both stale", func() bool {
		s := g.Snapshot([]string{addrA, addrB})
		return s[0].Stale && s[1].Stale
	})
	served = burst(t, base, 40, func(int) string { return chat(llama, `"max_tokens":30`, `"ignore_eos":true`) })
	if served[addrA]+served[addrB] != 40 || served[addrA] == 0 || served[addrB] == 0 {
		t.Fatalf("all stale must fail open over both: %v", served)
	}
}

// At debug level one decision in DecisionLogEvery is logged with every
// candidate's scores; the scrape error counter counts failed scrapes.
func TestDecisionLogAndScrapeErrors(t *testing.T) {
	s, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, llama, simserver.Options{})
	var logs logtest.Buffer
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, a, b)), func(o *setup) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.Core.DecisionLogEvery = 3
	})
	for range 6 {
		post(t, base, chat(llama))
	}
	if n := strings.Count(logs.String(), "msg=decision"); n != 2 {
		t.Fatalf("%d decisions logged of 6 at 1 in 3:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "kvCache=") {
		t.Errorf("decision log lacks the scores: %s", logs.String())
	}
	if err := s.SetFaults(simserver.Faults{MetricsErrorStatus: 503}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "scrape errors counted", func() bool {
		return counter(t, g, "kvgate_endpoint_scrape_errors_total", "endpoint", a) >= 2 && counter(t, g, "kvgate_endpoint_scrape_errors_total", "endpoint", b) == 0
	})
}
