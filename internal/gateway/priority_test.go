package gateway

import (
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
	"github.com/kvgate/kvgate/internal/simserver"
)

// TestObjectiveHeaderStaysInside: the objective header orders admission (how
// is internal/route's TestObjectivePriority) and does not reach the model
// server.
func TestObjectiveHeaderStaysInside(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Get(proxy.ObjectiveHeader))
		mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	cfg := gatewayConfig(scheduler("p", "m", strings.TrimPrefix(srv.URL, "http://")))
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "chat", Priority: 10}}
	_, base := startGateway(t, cfg)
	for _, objective := range []string{"chat", "no-such-objective"} {
		if resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat("m"), proxy.ObjectiveHeader, objective); resp.StatusCode != http.StatusOK {
			t.Fatalf("objective %q: %d", objective, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "" || got[1] != "" {
		t.Fatalf("the model server saw the objective header: %q", got)
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
