package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/internal/waittest"
)

// hashUpstream answers with the SHA-256 of the body it received.
func hashUpstream(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		h := sha256.New()
		_, _ = io.Copy(h, r.Body)
		w.Header().Set("X-Body-Sha256", hex.EncodeToString(h.Sum(nil)))
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// failAfterReading reads the whole body, then answers 503.
func failAfterReading(t *testing.T, calls *atomic.Int64) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":{"message":"busy","type":"server_error","code":503}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// A body much larger than what the model scan reads is replayed whole to the next
// endpoint when the first fails after reading it; with a retry buffer too small to
// hold it, the request is not retried and the failure is relayed, never a partial
// body.
func TestRetryReplaysLargeBody(t *testing.T) {
	var calls atomic.Int64
	bad := failAfterReading(t, &calls)
	good := hashUpstream(t)
	prompt := strings.Repeat("0123456789abcdef", 20_000) // 320 KB after the model
	body := `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
	sum := sha256.Sum256([]byte(body))

	sc := scheduler("p", "m", bad, good)
	sc.Picker = "round-robin"
	_, base := startGateway(t, gatewayConfig(sc))
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) || calls.Load() != 1 {
		t.Fatalf("status %d, body hash %q (want %x), failing endpoint called %d times", resp.StatusCode, resp.Header.Get("X-Body-Sha256"), sum, calls.Load())
	}

	small := int64(64 << 10)
	cfg := gatewayConfig(sc)
	cfg.Spec.Gateway.RetryBufferBytes = &small
	_, base2 := startGateway(t, cfg)
	resp, _, e := call(t, "POST", base2+"/v1/chat/completions", body)
	if resp.StatusCode != 503 || resp.Header.Get("X-Body-Sha256") != "" {
		t.Fatalf("over the retry buffer: status %d %q; want the first endpoint's 503 relayed", resp.StatusCode, e.Error.Message)
	}
}

// maxInFlightPerEndpoint holds under a crowd of waiters, and waiters get slots as
// they free up.
func TestInFlightLimitHolds(t *testing.T) {
	var cur, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(30 * time.Millisecond)
		cur.Add(-1)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	cfg := gatewayConfig(scheduler("p", "m", strings.TrimPrefix(srv.URL, "http://")))
	two, wait := int32(2), metav1.Duration{Duration: 10 * time.Second}
	cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &two, &wait
	_, base := startGateway(t, cfg)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 16 {
		wg.Go(func() {
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chat("m")))
			if err != nil || resp.StatusCode != 200 {
				failed.Add(1)
			}
			if err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 || peak.Load() > 2 {
		t.Fatalf("%d failed, peak concurrency at the endpoint %d with a limit of 2", failed.Load(), peak.Load())
	}
}

// A request waiting for a slot is woken by a request that started under the
// previous configuration.
func TestWaiterWokenAcrossReload(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Hold") != "" {
			<-release
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	cfg := gatewayConfig(scheduler("p", "m", strings.TrimPrefix(srv.URL, "http://")))
	one, wait := int32(1), metav1.Duration{Duration: 5 * time.Second}
	cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &one, &wait
	g, base := startGateway(t, cfg)
	held := make(chan struct{})
	go func() {
		defer close(held)
		call(t, "POST", base+"/v1/chat/completions", chat("m"), "X-Hold", "1")
	}()
	waittest.Until(t, 2*time.Second, "the held request in flight", func() bool { return counter(t, g, "kvgate_endpoint_in_flight") == 1 })
	if err := g.Apply(cfg); err != nil { // a reload while it is in flight
		t.Fatal(err)
	}
	waited := make(chan time.Duration)
	go func() {
		start := time.Now()
		resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat("m"))
		if resp.StatusCode != 200 {
			t.Errorf("waiter got %d", resp.StatusCode)
		}
		waited <- time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	<-held
	if d := <-waited; d > 2*time.Second {
		t.Fatalf("waiter took %v: not woken when the slot freed", d)
	}
}

// Clients cannot mint metric series, and a body over the limit behind a header
// model is a 413, not an upstream failure.
func TestClientInputStaysClient(t *testing.T) {
	up := hashUpstream(t)
	cfg := gatewayConfig(scheduler("p", "m", up))
	limit := int64(4 << 10)
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	g, base := startGateway(t, cfg)
	for i := range 20 {
		call(t, "POST", base+"/v1/chat/completions", chat("random-model-"+strings.Repeat("x", i)))
	}
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", `{"messages":[]}`, "X-Gateway-Model-Name", "\xff\xfe")
	if resp.StatusCode != 404 {
		t.Errorf("invalid UTF-8 model header: %d", resp.StatusCode)
	}
	fams, _ := g.Metrics().Registry.Gather()
	for _, f := range fams {
		if f.GetName() == "kvgate_requests_total" && len(f.GetMetric()) > 2 {
			t.Errorf("unknown models created %d series", len(f.GetMetric()))
		}
	}
	// Length known up front, and a chunked body that grows past the limit.
	big := `{"model":"m","p":"` + strings.Repeat("x", 8<<10) + `"}`
	resp, _, e := call(t, "POST", base+"/v1/chat/completions", big, "X-Gateway-Model-Name", "m")
	if resp.StatusCode != 413 {
		t.Errorf("oversize body with header model: %d %q", resp.StatusCode, e.Error.Message)
	}
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("X-Gateway-Model-Name", "m")
	req.ContentLength = -1
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 413 || counter(t, g, "kvgate_retries_total") != 0 {
		t.Errorf("chunked oversize body: %d, retries %v", r2.StatusCode, counter(t, g, "kvgate_retries_total"))
	}
}
