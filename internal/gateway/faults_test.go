package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/serving"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// faulty is a model server that misbehaves on purpose: its /metrics are a real
// idle simulator's (so the picker rates it the best endpoint, as a pod that
// fails fast with idle metrics is), and its answers break in the chosen way.
type faulty struct {
	mode    string // see serve
	metrics string // the idle simulator whose /metrics it shows
	frozen  atomic.Bool
	hits    atomic.Int64
	release chan struct{} // closed at cleanup: stalled handlers return
}

func startFaulty(t *testing.T, mode string) (*faulty, string) {
	t.Helper()
	_, idle := startSim(t, llama, simserver.Options{})
	f := &faulty{mode: mode, metrics: idle, release: make(chan struct{})}
	srv := httptest.NewServer(f)
	t.Cleanup(func() { close(f.release); srv.CloseClientConnections(); srv.Close() })
	return f, srv.Listener.Addr().String()
}

func (f *faulty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.frozen.Load() {
		<-f.release // a frozen process answers nothing, scrapes included
		return
	}
	if r.URL.Path == "/metrics" {
		resp, err := http.Get("http://" + f.metrics + "/metrics")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
		return
	}
	f.hits.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	event := func() {
		fmt.Fprint(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
		_ = http.NewResponseController(w).Flush()
	}
	switch f.mode {
	case "500": // fails at once
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	case "429": // overloaded: refuses at once
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":{"message":"too many requests"}}`, http.StatusTooManyRequests)
	case "headers-then-nothing": // a stream's headers, then silence
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		<-f.release
	case "die-after-headers": // a 200, then the connection drops
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case "cut-30": // 30% of streams, drawn at random, break after their first event
		w.Header().Set("Content-Type", "text/event-stream")
		event()
		if cutDraw() < 0.3 {
			panic(http.ErrAbortHandler)
		}
		event()
		fmt.Fprint(w, "data: [DONE]\n\n")
	case "json-cut": // part of a JSON answer, then the connection drops
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[`)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case "idle-mid-stream": // one event, then silence
		w.Header().Set("Content-Type", "text/event-stream")
		event()
		<-f.release
	case "slow": // an event every 100 ms for 6 s
		w.Header().Set("Content-Type", "text/event-stream")
		for range 60 {
			event()
			select {
			case <-r.Context().Done():
				return
			case <-f.release:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	case "paced": // a 256-byte event every 5 ms (about 50 KB/s, a fast model's pace) for a minute
		w.Header().Set("Content-Type", "text/event-stream")
		pad := strings.Repeat("x", 240)
		for range 12000 {
			if _, err := fmt.Fprintf(w, "data: {\"p\":%q}\n\n", pad); err != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-f.release:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	case "flood": // events as fast as the client takes them
		w.Header().Set("Content-Type", "text/event-stream")
		pad := strings.Repeat("x", 4096)
		for {
			if _, err := fmt.Fprintf(w, "data: {\"pad\":%q}\n\n", pad); err != nil {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-f.release:
				return
			default:
			}
		}
	}
}

var cutRand = struct {
	sync.Mutex
	*rand.Rand
}{Rand: rand.New(rand.NewPCG(16, 30))}

// cutDraw draws the fate of one stream of a "cut-30" server.
func cutDraw() float64 {
	cutRand.Lock()
	defer cutRand.Unlock()
	return cutRand.Float64()
}

// faultConfig is one scheduler over addrs with short bounds, so that each
// fault is met within a test's patience, and fast scrapes.
func faultConfig(addrs ...string) *v1alpha1.InferenceGatewayConfig {
	cfg := gatewayConfig(scheduler("p", llama, addrs...))
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	gw := &cfg.Spec.Gateway
	gw.FirstByteTimeout, gw.StreamIdleTimeout, gw.ClientWriteTimeout = d(300*time.Millisecond), d(300*time.Millisecond), d(500*time.Millisecond)
	three := int32(3)
	gw.Scrape = &v1alpha1.ScrapeSpec{Interval: d(20 * time.Millisecond), Timeout: d(100 * time.Millisecond), UnhealthyAfter: &three}
	return cfg
}

// streamAll sends n streaming chat requests, at most 8 at a time, and returns
// each one's error ("" for a stream that ended with [DONE] and content).
func streamAll(t *testing.T, base string, n int) []string {
	t.Helper()
	client := sdk(base, option.WithRequestTimeout(20*time.Second), option.WithMaxRetries(0))
	out := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("question ", i))}, MaxTokens: openai.Int(8)})
			got := ""
			for s.Next() {
				if len(s.Current().Choices) > 0 {
					got += s.Current().Choices[0].Delta.Content
				}
			}
			switch {
			case s.Err() != nil:
				out[i] = s.Err().Error()
			case got == "":
				out[i] = "no content"
			}
		})
	}
	wg.Wait()
	return out
}

// TestFaults: an endpoint that misbehaves before its first byte, while the
// picker rates it best, costs its requests a retry, never their answer: every
// request of the burst succeeds on the healthy simulator, none hangs.
func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		mode, reason string // the retries_total reason the fault is retried with
	}{
		{"500", "status"},
		{"429", "status"},
		{"headers-then-nothing", "timeout"},
		{"die-after-headers", "connect"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			bad, badAddr := startFaulty(t, tc.mode)
			_, good := startSim(t, llama, simserver.Options{})
			g, base := startGateway(t, faultConfig(badAddr, good))
			waitScraped(t, g, badAddr, good)
			start := time.Now()
			for i, e := range streamAll(t, base, 40) {
				if e != "" {
					t.Errorf("request %d: %s", i, e)
				}
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("40 requests took %v", took)
			}
			retries := counter(t, g, "kvgate_retries_total", "reason", tc.reason)
			t.Logf("%s: 40 of 40 answered in %v; the faulty endpoint got %d, each retried (%q)", tc.mode, time.Since(start).Round(time.Millisecond), bad.hits.Load(), tc.reason)
			if bad.hits.Load() == 0 || retries != float64(bad.hits.Load()) {
				t.Errorf("the faulty endpoint got %d requests, %v retried with reason %q: each should have been retried once", bad.hits.Load(), retries, tc.reason)
			}
		})
	}
}

// TestFaultStreamIdle: a stream that goes silent after it started ends with an
// explicit error event within streamIdleTimeout.
func TestFaultStreamIdle(t *testing.T) {
	_, addr := startFaulty(t, "idle-mid-stream")
	g, base := startGateway(t, faultConfig(addr))
	start := time.Now()
	resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama, `"stream":true`))
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"code":504`) || !strings.Contains(string(raw), "sent nothing for 300ms") {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	if n := counter(t, g, "kvgate_requests_total", "code", "stream_error"); n != 1 {
		t.Errorf("stream errors counted %v", n)
	}
}

// TestFaultFrozenEndpoint: an endpoint that freezes (its scrapes and its
// answers stop) while requests wait on it: the fleet marks it unhealthy, the
// waiting requests are retried elsewhere, and no request is lost or hangs.
func TestFaultFrozenEndpoint(t *testing.T) {
	bad, badAddr := startFaulty(t, "headers-then-nothing")
	bad.mode = "500"
	_, good := startSim(t, llama, simserver.Options{})
	cfg := faultConfig(badAddr, good)
	cfg.Spec.Gateway.FirstByteTimeout = &metav1.Duration{Duration: time.Minute} // only the fleet can notice
	one := int32(2)
	cfg.Spec.Gateway.MaxAttempts = &one
	g, base := startGateway(t, cfg)
	waitScraped(t, g, badAddr, good)
	bad.frozen.Store(true)
	start := time.Now()
	for i, e := range streamAll(t, base, 16) {
		if e != "" {
			t.Errorf("request %d: %s", i, e)
		}
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("16 requests took %v with one endpoint frozen", took)
	}
	t.Logf("frozen endpoint: 16 of 16 answered in %v, %v retried as unhealthy", time.Since(start).Round(time.Millisecond), counter(t, g, "kvgate_retries_total", "reason", "unhealthy"))
}

// TestFaultPoolFrozen: once the fleet knows every endpoint of a scheduler is
// down (both frozen), a request is refused at once with 503 and Retry-After
// instead of waiting on a frozen pod for a timeout; a thawed pool serves again.
func TestFaultPoolFrozen(t *testing.T) {
	a, aAddr := startFaulty(t, "slow")
	b, bAddr := startFaulty(t, "slow")
	cfg := faultConfig(aAddr, bAddr)
	// Only the fleet's knowledge can make this fast: the bounds are long.
	cfg.Spec.Gateway.FirstByteTimeout = &metav1.Duration{Duration: time.Minute}
	cfg.Spec.Gateway.ResponseHeaderTimeout = &metav1.Duration{Duration: time.Minute}
	g, base := startGateway(t, cfg)
	waitScraped(t, g, aAddr, bAddr)
	a.frozen.Store(true)
	b.frozen.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for len(g.Unready()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fleet never noticed the frozen pool")
		}
		time.Sleep(20 * time.Millisecond)
	}
	client := &http.Client{Timeout: 5 * time.Second} // a hang fails the test, not the suite
	for i := range 8 {
		start := time.Now()
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chat(llama, `"stream":true`)))
		if err != nil {
			t.Fatalf("request %d: %v after %v", i, err, time.Since(start))
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("request %d took %v", i, took)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(raw), "no ready endpoint") {
			t.Errorf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, raw)
		}
	}
	a.frozen.Store(false)
	b.frozen.Store(false)
	waitScraped(t, g, aAddr, bAddr)
	if resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama)); resp.StatusCode != 200 {
		t.Errorf("thawed: %d %s", resp.StatusCode, raw)
	}
}

// TestFaultJSONCut: a JSON answer that breaks part-way is read before
// anything reaches the client, so it is retried on another endpoint; with no
// other, the client gets a status and an OpenAI error, not a cut connection.
func TestFaultJSONCut(t *testing.T) {
	bad, badAddr := startFaulty(t, "json-cut")
	_, good := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, faultConfig(badAddr, good))
	waitScraped(t, g, badAddr, good)
	client := sdk(base, option.WithRequestTimeout(10*time.Second))
	for i := range 20 {
		c, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("question ", i))}, MaxTokens: openai.Int(4)})
		if err != nil || len(c.Choices) == 0 {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if bad.hits.Load() == 0 {
		t.Error("the cutting endpoint was never tried")
	}
	t.Logf("JSON cut short: 20 of 20 answered; the cutting endpoint got %d, each retried", bad.hits.Load())

	_, base = startGateway(t, faultConfig(badAddr))
	resp, raw, e := call(t, "POST", base+"/v1/chat/completions", chat(llama))
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || e.Error.Message == "" || strings.Contains(string(raw), "127.0.0.1") {
		t.Errorf("only a cutting endpoint: %d %s", resp.StatusCode, raw)
	}
}

// TestFaultCutStreams: a pod that breaks 30% of its streams after their first
// event, with idle metrics (its broken streams free it early, so it looks the
// idlest), draws less than its share once its error rate counts, where it drew
// the most without; every request ends with its answer or an error event.
func TestFaultCutStreams(t *testing.T) {
	share := map[string]float64{}
	for _, tc := range []struct {
		name   string
		weight int32 // of errorRate; -1: the profile's
	}{{"without errorRate", 0}, {"with errorRate", -1}} {
		bad, badAddr := startFaulty(t, "cut-30")
		_, good1 := startSim(t, llama, simserver.Options{})
		_, good2 := startSim(t, llama, simserver.Options{})
		cfg := faultConfig(badAddr, good1, good2)
		off := int32(0) // no ejection: a 30% pod rarely fails five in a row, and this measures the score
		cfg.Spec.Gateway.OutlierDetection = &v1alpha1.OutlierSpec{ConsecutiveFailures: &off}
		if tc.weight >= 0 {
			w := tc.weight
			cfg.Spec.Schedulers[0].Weights = &v1alpha1.Weights{ErrorRate: &w}
		}
		g, base := startGateway(t, cfg)
		waitScraped(t, g, badAddr, good1, good2)
		const n = 150
		failed := 0
		for _, e := range streamAll(t, base, n) {
			if e != "" {
				failed++
				if !strings.Contains(e, "stream") && !strings.Contains(e, "upstream") {
					t.Errorf("%s: a failed stream ended with %q, not an error event", tc.name, e)
				}
			}
		}
		share[tc.name] = float64(bad.hits.Load()) / n
		rate := 0.0
		for _, e := range g.FleetView()[0].Endpoints {
			if e.Address == badAddr {
				rate = e.ErrorRate
			}
		}
		t.Logf("%s: the cutting pod served %d of %d requests (%.0f%%, a fair share is 33%%), its error rate %.2f; %d streams broke", tc.name, bad.hits.Load(), n, 100*share[tc.name], rate, failed)
		if failed > int(bad.hits.Load()) {
			t.Errorf("%s: %d failed requests, more than the cutting pod served (%d)", tc.name, failed, bad.hits.Load())
		}
	}
	if share["with errorRate"] >= 1.0/3 || share["with errorRate"] >= share["without errorRate"]/2 {
		t.Errorf("the cutting pod's share: %.2f with errorRate, %.2f without; want below a fair third and half the other", share["with errorRate"], share["without errorRate"])
	}
}

// TestFaultSlowClients: clients that send a request and never read its answer
// hold an endpoint slot only until clientWriteTimeout; then others are served.
func TestFaultSlowClients(t *testing.T) {
	_, addr := startFaulty(t, "flood")
	cfg := faultConfig(addr)
	two := int32(2)
	cfg.Spec.Gateway.MaxInFlightPerEndpoint = &two
	g, base := startGateway(t, cfg)
	host := strings.TrimPrefix(base, "http://")
	body := chat(llama, `"stream":true`)
	for range 8 {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// and never read
	}
	// Within the write timeout and a margin, the stuck slots come back.
	began := time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inFlight := g.FleetView()[0].Endpoints[0].InFlight
		if inFlight == 0 && counter(t, g, "kvgate_requests_total", "code", "499") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held by clients that do not read: %d in flight", inFlight)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("8 clients that never read, 2 slots: slots free after %v", time.Since(began).Round(time.Millisecond))
	// A client that reads is served (not 429 for as long as the others stay).
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		t.Fatal("429 while the non-reading clients are still connected")
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if resp.StatusCode != 200 || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("%d %q", resp.StatusCode, line)
	}
}

// TestFaultStalledReaderOverTCP: a client that sends a streaming request over
// real TCP, with the kernel's default buffers, and never reads, frees its
// endpoint slot within clientWriteTimeout of its own receive buffer filling,
// not once the gateway's send buffer (megabytes) is full as well.
func TestFaultStalledReaderOverTCP(t *testing.T) {
	_, addr := startFaulty(t, "paced")
	g, _ := startGateway(t, faultConfig(addr))
	api := serving.NewAPI(g.front, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve(ln) }()
	t.Cleanup(func() { _ = api.Close() })
	waitScraped(t, g, addr)
	body := chat(llama, `"stream":true`)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// and never reads
	began := time.Now()
	inFlight := func() int64 { return g.FleetView()[0].Endpoints[0].InFlight }
	waittest.Until(t, 5*time.Second, "the request in flight", func() bool { return inFlight() == 1 })
	// At 50 KB/s a loopback receive buffer (128 KiB by default) fills in
	// about 3 s; the gateway's own send buffer grows to 4 MiB, 80 s more.
	const bound = 15 * time.Second
	for inFlight() != 0 {
		if time.Since(began) > bound {
			t.Fatalf("the slot of a client that stopped reading still held after %v", bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a client that never reads, over TCP at 50 KB/s: its slot free after %v (clientWriteTimeout 500ms)", time.Since(began).Round(time.Millisecond))
}

// TestRetriesCounted: a retry is counted when the next attempt starts, so the
// last failed attempt is not one: three dead endpoints, two retries.
func TestRetriesCounted(t *testing.T) {
	var dead []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, ln.Addr().String())
		_ = ln.Close()
	}
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, dead...)))
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama))
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("dead pool: %d %v", resp.StatusCode, resp.Header)
	}
	if n := counter(t, g, "kvgate_retries_total", "reason", "connect"); n != 2 {
		t.Errorf("retries counted %v, want 2 (three attempts)", n)
	}
}

// waitScraped waits until the fleet reads every addr as healthy.
func waitScraped(t *testing.T, g *fixture, addrs ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, s := range g.Snapshot(addrs) {
			ok = ok && s.Healthy && !s.Stale
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoints %v never read healthy: %+v", addrs, g.Snapshot(addrs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutlierEjection: a pod that answers 500 at once while its metrics look
// idle — the picker's favourite — is ejected after five failures in a row and
// then gets almost nothing, even with retries off; with every endpoint failing,
// at most half are ejected (the scheduler fails open).
func TestOutlierEjection(t *testing.T) {
	// With the default profile the errorRate score passes the pod over after
	// its first failures; with it off, ejection alone must do it.
	for _, scored := range []bool{true, false} {
		bad, badAddr := startFaulty(t, "500")
		_, good := startSim(t, llama, simserver.Options{})
		cfg := faultConfig(badAddr, good)
		one := int32(1)
		cfg.Spec.Gateway.MaxAttempts = &one
		if !scored {
			zero := int32(0)
			cfg.Spec.Schedulers[0].Weights = &v1alpha1.Weights{ErrorRate: &zero}
		}
		g, base := startGateway(t, cfg)
		waitScraped(t, g, badAddr, good)
		failed := 0
		for range 200 {
			resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama))
			if resp.StatusCode != 200 {
				failed++
			}
		}
		t.Logf("500 at once, idle metrics, no retries, errorRate scored %v: the pod got %d of 200 requests, %d failed", scored, bad.hits.Load(), failed)
		if hits := bad.hits.Load(); hits > 10 || failed > 10 {
			t.Errorf("errorRate scored %v: the failing pod got %d of 200 requests (%d failed), want ≤ 10 (5%%)", scored, hits, failed)
		}
		if scored {
			continue
		}
		if n := counter(t, g, "kvgate_endpoint_ejections_total", "endpoint", badAddr); n != 1 {
			t.Errorf("ejections %v, want 1", n)
		}
		if n := counter(t, g, "kvgate_endpoint_ejected", "endpoint", badAddr); n != 1 {
			t.Errorf("kvgate_endpoint_ejected %v", n)
		}
		for _, e := range g.FleetView()[0].Endpoints {
			if (e.Address == badAddr) != (e.EjectedForMs > 0) {
				t.Errorf("/debug/fleet: %s ejected for %v ms", e.Address, e.EjectedForMs)
			}
		}
		if resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), "X-Kvgate-Explain", "1"); !strings.Contains(resp.Header.Get("X-Kvgate-Scores"), "; ejected "+badAddr) {
			t.Errorf("x-kvgate-scores does not show the ejection: %q", resp.Header.Get("X-Kvgate-Scores"))
		}
	}

	// Both failing: one is ejected, the other keeps serving (its 500s) rather
	// than the scheduler refusing everything.
	b1, a1 := startFaulty(t, "500")
	b2, a2 := startFaulty(t, "500")
	g2, base2 := startGateway(t, faultConfig(a1, a2))
	waitScraped(t, g2, a1, a2)
	for range 40 {
		call(t, "POST", base2+"/v1/chat/completions", chat(llama))
	}
	if n := counter(t, g2, "kvgate_endpoint_ejected"); n != 1 {
		t.Errorf("%v of 2 failing endpoints ejected, want 1 (maxEjectionPercent 50)", n)
	}
	if b1.hits.Load() == 0 || b2.hits.Load() == 0 {
		t.Errorf("hits %d / %d", b1.hits.Load(), b2.hits.Load())
	}
}
