package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// Helpers that send requests through the gateway, or load model servers
// directly (as other gateways or clients would). Where the core sends requests
// is internal/route's tests.

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

// streamed is a streaming chat request of about 2,000 prompt tokens, unique
// per i so that no prefix is shared.
func streamed(i int) string {
	content := fmt.Sprintf("Request %d. ", i) + strings.Repeat("Compare the two tenders line by line and list the differences. ", 125)
	return `{"model":"` + llama + `","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
}

func sched(name, model, engine string, addrs ...string) v1alpha1.SchedulerSpec {
	sc := scheduler(name, model, addrs...)
	sc.EngineType = engine
	return sc
}

// TestScrapeErrors: the scrape error counter counts an endpoint's failed
// scrapes, and only its. (The decisions the core makes of what scrapes read
// are internal/route's tests.)
func TestScrapeErrors(t *testing.T) {
	s, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, llama, simserver.Options{})
	g, _ := startGateway(t, gatewayConfig(scheduler("p", llama, a, b)))
	if err := s.SetFaults(simserver.Faults{MetricsErrorStatus: 503}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "scrape errors counted", func() bool {
		return counter(t, g, "kvgate_endpoint_scrape_errors_total", "endpoint", a) >= 2 && counter(t, g, "kvgate_endpoint_scrape_errors_total", "endpoint", b) == 0
	})
}
