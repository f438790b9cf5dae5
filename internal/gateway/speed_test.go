package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/latency"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// The tests below put simulated model servers of unequal speed behind the
// gateway and assert that the predictedLatency scorer (in the default
// profile) sends each its share by speed.

// streamed is a streaming chat request of about 2,000 prompt tokens, unique
// per i so that no prefix is shared.
func streamed(i int) string {
	content := fmt.Sprintf("Request %d. ", i) + strings.Repeat("Compare the two tenders line by line and list the differences. ", 125)
	return `{"model":"` + llama + `","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
}

// gpuSim starts a simulated Llama-3.1-8B server on one GPU of the kind.
func gpuSim(t *testing.T, gpu string) string {
	t.Helper()
	_, addr := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: gpu, ModelSize: "8b"}})
	return addr
}

// slowScrapes makes the fleet read metrics once and then only every 30 s:
// what routing does between two scrapes is the gateway's own doing.
func slowScrapes(cfg *v1alpha1.InferenceGatewayConfig) {
	cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{Interval: &metav1.Duration{Duration: 30 * time.Second}, StaleAfter: &metav1.Duration{Duration: 10 * time.Minute}}
}

// speeds returns each endpoint's learned speed, by address.
func speeds(g *fixture) map[string]latency.Speed {
	out := map[string]latency.Speed{}
	for _, v := range g.FleetView() {
		for _, e := range v.Endpoints {
			out[e.Address] = e.Speed
		}
	}
	return out
}

// warmUp sends waves of concurrent streamed requests through the gateway, at
// least three and until every endpoint has learned a speed of its own: waves
// of ten per endpoint, so that each sees work queued (a pod only ever idle
// tells its latency, not its throughput).
func warmUp(t *testing.T, g *fixture, base string, addrs []string) {
	t.Helper()
	n, waves := 0, 0
	waittest.Until(t, 2*time.Minute, "every endpoint to learn its speed", func() bool {
		burst(t, base, 10*len(addrs), func(i int) string { return streamed(n + i) })
		n += 10 * len(addrs)
		if waves++; waves < 3 {
			return false
		}
		sp := speeds(g)
		for _, a := range addrs {
			if sp[a].Borrowed {
				return false
			}
		}
		return true
	})
}

// explainedBurst is burst asking for each decision's scores (x-kvgate-explain),
// returned by endpoint in the order the answers came.
func explainedBurst(t *testing.T, base string, n int, body func(i int) string) (map[string]int, map[string][]string) {
	t.Helper()
	var mu sync.Mutex
	served, scores := map[string]int{}, map[string][]string{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body(i)))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-Kvgate-Explain", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d", resp.StatusCode)
			}
			ep := resp.Header.Get("X-Kvgate-Endpoint")
			mu.Lock()
			served[ep]++
			scores[ep] = append(scores[ep], resp.Header.Get("X-Kvgate-Scores"))
			mu.Unlock()
		})
	}
	wg.Wait()
	return served, scores
}

// capacity measures a server's prefill throughput: n of the test's requests
// sent to it at once, over the time until the last first token.
func capacity(t *testing.T, addr string, n int) float64 {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last time.Duration
	for i := range n {
		wg.Go(func() {
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(streamed(1e6+i)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "data:") {
				t.Errorf("first line %q: %v", line, err)
			}
			mu.Lock()
			last = max(last, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(n) / last.Seconds()
}

// TestBurstSplitsBySpeed: three servers of different GPUs (H100, A100, A10G),
// every one looking idle at the last scrape, take a burst of 60 requests
// arriving at once with the default profile: the split follows their learned
// speeds, the A10G getting no more than 1.5× its share of the fleet's measured
// capacity (with two of slack) where an even split would give it 20. (Which of
// the H100 and the A100 gets more varies from run to run: the KV cache, queue
// and prefill scorers weigh them alike, and the H100's lead is within their
// weight.)
func TestBurstSplitsBySpeed(t *testing.T) {
	gpus := []string{"h100", "a100", "a10g"}
	addrs := make([]string, len(gpus))
	capacities := make([]float64, len(gpus))
	total := 0.0
	for i, gpu := range gpus {
		addrs[i] = gpuSim(t, gpu)
		capacities[i] = capacity(t, addrs[i], 20)
		total += capacities[i]
	}
	share := capacities[2] / total
	most := int(1.5*share*60+0.999) + 2 // a busy machine slows the fast servers most
	cfg := gatewayConfig(scheduler("p", llama, addrs...))
	slowScrapes(cfg)
	g, base := startGateway(t, cfg)
	warmUp(t, g, base, addrs)
	waittest.Until(t, 30*time.Second, "the warm-up to end", func() bool {
		for _, e := range g.FleetView()[0].Endpoints {
			if e.InFlight > 0 {
				return false
			}
		}
		return true
	})
	for i, a := range addrs {
		sp := speeds(g)[a]
		t.Logf("%s learned: base %.3f s, own %.3f s/ktok, queued %.3f s/ktok, running %.4f s, %d samples", gpus[i], sp.Base, sp.PerKToken, sp.PerKTokenQueued, sp.PerRunning, sp.Samples)
	}
	served, scores := explainedBurst(t, base, 60, func(i int) string { return streamed(2e6 + i) })
	h, a, s := served[addrs[0]], served[addrs[1]], served[addrs[2]]
	t.Logf("capacities %.1f req/s (A10G share %.0f%%); the burst's 60 went H100 %d, A100 %d, A10G %d", capacities, 100*share, h, a, s)
	if s > most {
		t.Errorf("the A10G took %d of 60, at most %d wanted (its capacity share %.0f%%, an even split 20)", s, most, 100*share)
		names := strings.NewReplacer(addrs[0], "h100", addrs[1], "a100", addrs[2], "a10g")
		for _, sc := range scores[addrs[2]] {
			t.Logf("to the A10G: %s", names.Replace(sc))
		}
	}
	if h < s || a < s {
		t.Errorf("a faster server got less of the burst than the A10G: H100 %d, A100 %d, A10G %d", h, a, s)
	}
}

// TestSlowdownLosesShare: of two like servers under steady load, the one whose
// engine slows to half speed mid-run loses share within the stated time
// (docs/configuration.md: a few dozen of its answers; here 10 s), and the
// learned speed shows it.
func TestSlowdownLosesShare(t *testing.T) {
	s, addr := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	other := gpuSim(t, "h100")
	cfg := gatewayConfig(scheduler("p", llama, addr, other))
	g, base := startGateway(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	served := map[string]int{}
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for c := range 6 { // closed-loop clients
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				ep := post(t, base, streamed(c*1e6+i))
				mu.Lock()
				served[ep]++
				mu.Unlock()
			}
		})
	}
	window := func(d time.Duration) (int, int) {
		mu.Lock()
		a0, b0 := served[addr], served[other]
		mu.Unlock()
		time.Sleep(d)
		mu.Lock()
		defer mu.Unlock()
		return served[addr] - a0, served[other] - b0
	}
	a, b := window(4 * time.Second)
	before := float64(a) / float64(a+b)
	if err := s.SetFaults(simserver.Faults{Slowdown: 2}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second) // the stated time
	a, b = window(5 * time.Second)
	after := float64(a) / float64(a+b)
	cancel()
	t.Logf("share before %.2f, after %.2f; speeds %+v", before, after, speeds(g))
	if before < 0.35 || after > 0.4 || after > before-0.1 {
		t.Fatalf("the slowed server's share went from %.2f to %.2f (want about half, then under 0.4)", before, after)
	}
}
