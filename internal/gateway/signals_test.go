package gateway

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestPodWithoutKVMetrics: of three like pods under the same load, one does
// not publish KV-cache usage. It is neither favoured (its missing gauge read as
// an empty cache would draw the kvCache scorer's weight) nor starved: each pod
// gets its fair third within 20%, with the default profile and with weights
// where the KV cache is nearly all that counts; /debug/fleet says what it
// lacks.
func TestPodWithoutKVMetrics(t *testing.T) {
	zero, one, six := int32(0), int32(1), int32(6)
	for _, tc := range []struct {
		name    string
		weights *v1alpha1.Weights
	}{
		{"default profile", nil},
		{"KV cache first", &v1alpha1.Weights{KVCache: &six, Queue: &one, Prefix: &zero, PrefillQueue: &zero, ErrorRate: &zero, PredictedLatency: &zero}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 2000}
			_, a := startSim(t, llama, simserver.Options{Engine: eng})
			_, b := startSim(t, llama, simserver.Options{Engine: eng})
			_, c := startSim(t, llama, simserver.Options{Engine: eng, OmitMetrics: []string{"vllm:kv_cache_usage_perc", "vllm:cache_config_info"}})
			sc := sched("p", llama, "vllm", a, b, c)
			sc.Weights = tc.weights
			g, base := startGateway(t, gatewayConfig(sc))
			// The same long requests straight to each pod hold about half of
			// every KV cache: read as empty, the pod without the gauge would
			// look the emptier by half a cache.
			long := func(i int) string {
				return `{"model":"` + llama + `","messages":[{"role":"user","content":"Report ` + strconv.Itoa(i) + `. ` +
					strings.Repeat("Summarise the quarterly report in detail please. ", 200) + `"}],"max_tokens":20000,"ignore_eos":true}`
			}
			for _, addr := range []string{a, b, c} {
				for i := range 3 {
					load(t, addr, 1, long(i))
				}
			}
			waittest.Until(t, 20*time.Second, "the load to show", func() bool {
				s := g.Snapshot([]string{a, b, c})
				return s[0].KVUsage > 0.4 && s[1].KVUsage > 0.4 && s[2].Running >= 3
			})
			served := map[string]int{}
			for range 10 {
				for ep, n := range burst(t, base, 9, func(int) string { return chat(llama) }) {
					served[ep] += n
				}
			}
			t.Logf("90 requests: %v", served)
			for _, addr := range []string{a, b, c} {
				if n := served[addr]; n < 24 || n > 36 {
					t.Errorf("%s served %d of 90, want 30 ± 20%%: %v", addr, n, served)
				}
			}
			for _, e := range g.FleetView()[0].Endpoints {
				if kv := slices.Contains(e.Publishes, "kvUsage"); kv != (e.Address != c) {
					t.Errorf("/debug/fleet: %s publishes %v", e.Address, e.Publishes)
				}
			}
		})
	}
}

// TestSessionAffinity: a session's requests return to the pod that served it
// while that pod is healthy and unsaturated, move when it saturates or fails,
// and stay where they moved; the key comes from the configured header, or the
// body's user field.
func TestSessionAffinity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		affinity v1alpha1.SessionAffinitySpec
		send     func(t *testing.T, base, session string) string
	}{
		{"header", v1alpha1.SessionAffinitySpec{}, func(t *testing.T, base, session string) string {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat(llama)))
			req.Header.Set("X-Session-Id", session)
			return do(t, req)
		}},
		{"user field", v1alpha1.SessionAffinitySpec{FromUser: true, TTL: &metav1.Duration{Duration: time.Minute}}, func(t *testing.T, base, session string) string {
			return post(t, base, chat(llama, `"user":"`+session+`"`))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 1}
			var addrs []string
			servers := map[string]*simserver.Server{}
			for range 3 {
				srv, addr := startSim(t, llama, simserver.Options{Engine: eng})
				addrs = append(addrs, addr)
				servers[addr] = srv
			}
			sc := sched("p", llama, "vllm", addrs...)
			sc.SessionAffinity = &tc.affinity
			g, base := startGateway(t, gatewayConfig(sc))
			waittest.Until(t, 5*time.Second, "the first scrapes", func() bool {
				return !slices.ContainsFunc(g.Snapshot(addrs), func(s fleet.Snapshot) bool { return !s.Scraped })
			})
			home := map[string]string{}
			for _, s := range []string{"s-1", "s-2", "s-3", "s-4"} {
				home[s] = tc.send(t, base, s)
				for range 4 {
					if got := tc.send(t, base, s); got != home[s] {
						t.Fatalf("session %s went to %s, then %s", s, home[s], got)
					}
				}
			}
			// Saturate s-1's pod: six long requests straight to it queue
			// five (one runs at a time).
			busy := home["s-1"]
			stop := load(t, busy, 6, chat(llama, `"max_tokens":20000`, `"ignore_eos":true`))
			waittest.Until(t, 10*time.Second, "the queue to show", func() bool { return g.Snapshot([]string{busy})[0].Waiting >= 5 })
			moved := tc.send(t, base, "s-1")
			if moved == busy {
				t.Fatalf("session s-1 stayed on its saturated pod %s", busy)
			}
			stop()
			waittest.Until(t, 10*time.Second, "the queue to drain", func() bool { return g.Snapshot([]string{busy})[0].Waiting == 0 })
			for range 4 {
				if got := tc.send(t, base, "s-1"); got != moved {
					t.Fatalf("session s-1 moved to %s, then went to %s", moved, got)
				}
			}
			// s-2's pod fails every request: the gateway retries elsewhere,
			// the session moves there, and stays when the pod recovers.
			broken := home["s-2"]
			if err := servers[broken].SetFaults(simserver.Faults{ErrorRate: 1}); err != nil {
				t.Fatal(err)
			}
			moved = tc.send(t, base, "s-2")
			if moved == broken {
				t.Fatalf("session s-2 was served by its failing pod %s", broken)
			}
			if err := servers[broken].SetFaults(simserver.Faults{}); err != nil {
				t.Fatal(err)
			}
			for range 4 {
				if got := tc.send(t, base, "s-2"); got != moved {
					t.Fatalf("session s-2 moved to %s off its failing pod, then went to %s", moved, got)
				}
			}
		})
	}
}

// do sends a request and returns the endpoint that served it, failing the test
// unless the answer is 200.
func do(t *testing.T, req *http.Request) string {
	t.Helper()
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	return resp.Header.Get("X-Kvgate-Endpoint")
}

// TestTTFTObjective: once the pool has learned its speed, a request whose
// objective's ttftSLO no endpoint is predicted to meet is shed at once (429,
// Retry-After) when sheddable and served when not; both are counted.
func TestTTFTObjective(t *testing.T) {
	_, addr := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "a10g", ModelSize: "8b"}})
	cfg := gatewayConfig(scheduler("p", llama, addr))
	tight := &metav1.Duration{Duration: time.Millisecond}
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "bulk", Priority: -1, TTFTSLO: tight}, {Name: "chat", TTFTSLO: tight}, {Name: "relaxed", Priority: -1}}
	g, base := startGateway(t, cfg)
	send := func(objective string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(streamed(0)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Gateway-Inference-Objective", objective)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// Before the pool has answered there is nothing to predict by.
	if resp := send("bulk"); resp.StatusCode != http.StatusOK {
		t.Fatalf("before any answer: status %d", resp.StatusCode)
	}
	waittest.Until(t, 30*time.Second, "the pool to learn its speed", func() bool {
		send("relaxed")
		return !g.FleetView()[0].Endpoints[0].Speed.Borrowed
	})
	time.Sleep(150 * time.Millisecond) // the pool's median is refreshed every 100 ms
	send("relaxed")
	resp := send("bulk")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a sheddable request no endpoint can start in 1 ms: status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := send("chat"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a request that is not sheddable: status %d", resp.StatusCode)
	}
	if resp := send("relaxed"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a sheddable request without an objective: status %d", resp.StatusCode)
	}
	for action, want := range map[string]float64{"shed": 1, "routed": 1} {
		if got := counter(t, g, "kvgate_ttft_slo_unmet_total", "scheduler", "p", "action", action); got != want {
			t.Errorf("kvgate_ttft_slo_unmet_total{action=%q} = %v, want %v", action, got, want)
		}
	}
	if got := counter(t, g, "kvgate_shed_total", "scheduler", "p", "reason", "slo"); got != 1 {
		t.Errorf(`kvgate_shed_total{reason="slo"} = %v, want 1`, got)
	}
}
