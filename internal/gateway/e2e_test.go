package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

func TestRoutesByModelAcrossPools(t *testing.T) {
	_, a1 := startSim(t, llama, simserver.Options{LoRAModules: []string{"sql"}})
	_, a2 := startSim(t, llama, simserver.Options{LoRAModules: []string{"sql"}})
	_, b1 := startSim(t, qwen, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "32b", TensorParallel: 2}})
	llamaPool := scheduler("llama", llama, a1, a2)
	llamaPool.LoRAAdapters = []string{"sql"}
	g, base := startGateway(t, gatewayConfig(llamaPool, scheduler("qwen", qwen, b1)))
	c := sdk(base)
	seen := map[string][]string{}
	for i := range 12 {
		model := []string{llama, qwen, "sql"}[i%3]
		var ep string
		resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(3),
		}, servedBy(&ep))
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if resp.Model != model {
			t.Errorf("asked %s, answered as %s", model, resp.Model)
		}
		seen[model] = append(seen[model], ep)
	}
	for model, eps := range seen {
		for _, ep := range eps {
			want := []string{a1, a2}
			if model == qwen {
				want = []string{b1}
			}
			if !slices.Contains(want, ep) {
				t.Errorf("%s served by %s, not in its pool %v", model, ep, want)
			}
		}
	}
	// The header routes a body that names no model; one that names another
	// is refused (integrity_test.go).
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "X-Gateway-Model-Name", qwen)
	if resp.StatusCode != 400 || resp.Header.Get("X-Kvgate-Scheduler") != "qwen" {
		t.Errorf("header model: %d via %q (qwen's server rejects a body without a model)", resp.StatusCode, resp.Header.Get("X-Kvgate-Scheduler"))
	}
	if got := counter(t, g, "kvgate_requests_total", "scheduler", "qwen", "code", "200"); got != 4 {
		t.Errorf("kvgate_requests_total{qwen,200} = %v, want 4", got)
	}
	page, err := c.Models.List(context.Background())
	if err != nil || len(page.Data) != 3 {
		t.Fatalf("models: %v %v", page, err)
	}
	// A configuration from a file has no creation time: the models are dated
	// by the gateway's first configuration, not by year one.
	if now := time.Now().Unix(); page.Data[0].Created < now-3600 || page.Data[0].Created > now {
		t.Errorf("models listed as created at %d", page.Data[0].Created)
	}
	// models.retrieve, a model id with slashes included.
	for _, m := range page.Data {
		got, err := c.Models.Get(context.Background(), m.ID)
		if err != nil || got.ID != m.ID || got.Created != m.Created {
			t.Errorf("models.retrieve(%q): %+v, %v", m.ID, got, err)
		}
	}
	var apiErr *openai.Error
	if _, err := c.Models.Get(context.Background(), "no-such-model"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("models.retrieve of an unknown model: %v", err)
	}
}

// fixedSSE is an upstream that sends the same bytes every time, in irregular pieces.
func fixedSSE(t *testing.T) (string, []byte) {
	var body bytes.Buffer
	for i := range 200 {
		fmt.Fprintf(&body, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d \\u00e9\\n\"}}]}\n\n", i)
	}
	body.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":200,\"total_tokens\":207}}\n\ndata: [DONE]\n\n")
	want := body.Bytes()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for off, step := 0, 1; off < len(want); step = step*7%97 + 1 {
			end := min(off+step, len(want))
			_, _ = w.Write(want[off:end])
			_ = rc.Flush()
			off = end
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), want
}

func TestStreamedBytesIdenticalToDirect(t *testing.T) {
	up, want := fixedSSE(t)
	g, base := startGateway(t, gatewayConfig(scheduler("fixed", "m", up)))
	direct, gotDirect, _ := call(t, "POST", "http://"+up+"/v1/chat/completions", chat("m", `"stream":true`))
	via, gotVia, _ := call(t, "POST", base+"/v1/chat/completions", chat("m", `"stream":true`))
	if direct.StatusCode != 200 || via.StatusCode != 200 {
		t.Fatalf("status %d / %d", direct.StatusCode, via.StatusCode)
	}
	if !bytes.Equal(gotDirect, want) || !bytes.Equal(gotVia, gotDirect) {
		t.Fatalf("bytes differ: direct %d, via gateway %d, want %d", len(gotDirect), len(gotVia), len(want))
	}
	if got := counter(t, g, "kvgate_tokens_total", "kind", "completion"); got != 200 {
		t.Errorf("completion tokens from the usage chunk: %v, want 200", got)
	}

	// Against the simulator: the same seed and the same request give the same
	// stream directly and through the gateway, apart from the timestamp.
	_, s1 := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", Seed: 5}})
	_, s2 := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", Seed: 5}})
	_, viaSim := startGateway(t, gatewayConfig(scheduler("sim", llama, s2)))
	req := chat(llama, `"stream":true`, `"stream_options":{"include_usage":true}`, `"ignore_eos":true`)
	_, a, _ := call(t, "POST", "http://"+s1+"/v1/chat/completions", req)
	_, b, _ := call(t, "POST", viaSim+"/v1/chat/completions", req)
	created := func(b []byte) []byte {
		return bytes.Join(bytes.FieldsFunc(b, func(r rune) bool { return r >= '0' && r <= '9' }), nil)
	}
	if !bytes.Equal(created(a), created(b)) || len(a) != len(b) {
		t.Errorf("simulator stream differs through the gateway:\n%s\n---\n%s", a, b)
	}
}

func TestRetriesBeforeFirstByte(t *testing.T) {
	dead, deadAddr := startSim(t, llama, simserver.Options{})
	failing, failingAddr := startSim(t, llama, simserver.Options{})
	_, okAddr := startSim(t, llama, simserver.Options{})
	if err := dead.SetFaults(simserver.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	if err := failing.SetFaults(simserver.Faults{ErrorRate: 1, ErrorStatus: 503}); err != nil {
		t.Fatal(err)
	}
	// The least-request picker keeps trying the broken endpoints; the GPU-aware one
	// would stop choosing them once their scrapes fail (TestGPUAwarePicking).
	sc := scheduler("p", llama, deadAddr, failingAddr, okAddr)
	sc.Picker = "least-request"
	g, base := startGateway(t, gatewayConfig(sc))
	c := sdk(base)
	for range 20 {
		var ep string
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(3),
		}, servedBy(&ep))
		for stream.Next() {
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("request failed despite a healthy endpoint: %v", err)
		}
		if ep != okAddr {
			t.Fatalf("served by %s, want the healthy %s", ep, okAddr)
		}
	}
	if c := counter(t, g, "kvgate_retries_total", "reason", "connect"); c == 0 {
		t.Error("no retry after connection refusals")
	}
	if c := counter(t, g, "kvgate_retries_total", "reason", "status"); c == 0 {
		t.Error("no retry after 503s")
	}
	// One attempt only: the failure reaches the client as an OpenAI error.
	one := int32(1)
	cfg := gatewayConfig(scheduler("p", llama, deadAddr))
	cfg.Spec.Gateway.MaxAttempts = &one
	_, base1 := startGateway(t, cfg)
	// Neither the pod's address nor Go's dial error reaches the client.
	// A pool whose every endpoint fails is unavailable: 503, worth a retry soon.
	if resp, raw, e := call(t, "POST", base1+"/v1/chat/completions", chat(llama)); resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" ||
		!strings.HasPrefix(e.Error.Message, "no endpoint could serve the request; retry later (request id ") ||
		strings.Contains(string(raw), deadAddr) || strings.Contains(string(raw), "dial") {
		t.Errorf("dead pool: %d %s", resp.StatusCode, raw)
	}
}

// TestServerErrorsStayInside: a model server's 5xx goes to the client as the
// gateway's own error — its status and the request id — never the server's
// body (a traceback, a sidecar's dial error with the pod's address); a 4xx,
// which is about the request, is relayed as it is.
func TestServerErrorsStayInside(t *testing.T) {
	for _, tc := range []struct {
		status      int
		body        string
		relayed     bool
		retryAfter  string
		contentType string
	}{
		{500, "Traceback (most recent call last):\n  File \"/app/vllm/engine.py\", line 3\nRuntimeError: CUDA error at 10.1.2.3", false, "", "text/plain"},
		{502, "upstream connect error or disconnect/reset before headers. reset reason: connection failure, transport failure reason: delayed connect error: 111 10.1.2.3:8000", false, "", "text/plain"},
		{503, `{"error":{"message":"engine dead at 10.1.2.3","type":"InternalServerError"}}`, false, "1", "application/json"},
		{400, `{"error":{"message":"maximum context length is 8192 tokens","type":"BadRequestError","code":400}}`, true, "", "application/json"},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if notMetrics(w, r) {
					return
				}
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer up.Close()
			one := int32(1)
			cfg := gatewayConfig(scheduler("p", llama, strings.TrimPrefix(up.URL, "http://")))
			cfg.Spec.Gateway.MaxAttempts = &one
			logs := &logtest.Buffer{}
			_, base := startGateway(t, cfg, func(o *setup) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
			resp, raw, e := call(t, "POST", base+"/v1/chat/completions", chat(llama), "X-Request-Id", "rid-77")
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != tc.retryAfter {
				t.Fatalf("%d (Retry-After %q) %s", resp.StatusCode, resp.Header.Get("Retry-After"), raw)
			}
			if tc.relayed {
				if string(raw) != tc.body {
					t.Errorf("a 4xx must be relayed as it is: %s", raw)
				}
				return
			}
			if strings.Contains(string(raw), "10.1.2.3") || strings.Contains(string(raw), "Traceback") || e.Error.Type != "server_error" ||
				!strings.Contains(e.Error.Message, "rid-77") || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("body %s", raw)
			}
			if !strings.Contains(logs.String(), "10.1.2.3") {
				t.Errorf("the server's answer is not in the log: %s", logs.String())
			}
		})
	}
}

func TestKillMidStreamEndsWithError(t *testing.T) {
	s, addr := startSim(t, llama, simserver.Options{})
	_ = s.SetFaults(simserver.Faults{CloseMidStreamRate: 1, CloseAfterTokens: 3})
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, addr)))
	resp, raw, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama, `"stream":true`, `"max_tokens":50`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
	lastEvent := events[len(events)-1]
	if !strings.HasPrefix(lastEvent, `data: {"error":{"message":"the model server failed mid-response","type"`) || strings.Contains(string(raw), "[DONE]") {
		t.Fatalf("stream did not end with an error event:\n%s", raw)
	}
	if got := counter(t, g, "kvgate_stream_errors_total"); got != 1 {
		t.Errorf("kvgate_stream_errors_total = %v", got)
	}
	// The SDK reports it as an error, not as a finished answer.
	c := sdk(base)
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(50),
	})
	for stream.Next() {
	}
	if stream.Err() == nil {
		t.Error("SDK saw a clean end of a broken stream")
	}
	// No retry once bytes were sent.
	if got := counter(t, g, "kvgate_retries_total"); got != 0 {
		t.Errorf("retried after bytes were sent: %v", got)
	}
}

// TestAdmission: a refusal of the routing core's admission (when and why it
// refuses is internal/route's TestAdmission) reaches the client as its status,
// with Retry-After, and an OpenAI error body; a routeTimeout while the
// endpoint hangs ends the request with 504.
func TestAdmission(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    func() *v1alpha1.InferenceGatewayConfig
		status int
		typ    string
		msg    string
	}{
		{"no endpoint", func() *v1alpha1.InferenceGatewayConfig {
			return gatewayConfig(v1alpha1.SchedulerSpec{Name: "empty", ModelName: llama, ModelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}})
		}, http.StatusServiceUnavailable, "overloaded_error", "no ready endpoint"},
		{"saturated", func() *v1alpha1.InferenceGatewayConfig {
			cfg := gatewayConfig(scheduler("p", llama, "127.0.0.1:1")) // never reached: its one slot is held
			one, wait := int32(1), metav1.Duration{Duration: 50 * time.Millisecond}
			cfg.Spec.Gateway.MaxInFlightPerEndpoint, cfg.Spec.Gateway.QueueTimeout = &one, &wait
			return cfg
		}, http.StatusTooManyRequests, "overloaded_error", "in flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, base := startGateway(t, tc.cfg())
			if tc.status == http.StatusTooManyRequests {
				held, ref := g.Route(context.Background(), route.Request{Model: llama})
				if ref != nil {
					t.Fatalf("holding the slot: %d %s", ref.Status, ref.Message)
				}
				defer held.Finish(route.Outcome{Status: http.StatusOK})
			}
			resp, _, e := call(t, "POST", base+"/v1/chat/completions", chat(llama))
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != "1" || e.Error.Type != tc.typ || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("%d Retry-After=%q %+v, want %d Retry-After=1 type %s saying %q", resp.StatusCode, resp.Header.Get("Retry-After"), e.Error, tc.status, tc.typ, tc.msg)
			}
		})
	}
	t.Run("route timeout", func(t *testing.T) {
		hang, hangAddr := startSim(t, llama, simserver.Options{})
		_ = hang.SetFaults(simserver.Faults{HangRate: 1})
		sc := scheduler("p", llama, hangAddr)
		sc.RouteTimeout = &metav1.Duration{Duration: 200 * time.Millisecond}
		_, base := startGateway(t, gatewayConfig(sc))
		start := time.Now()
		resp, _, e := call(t, "POST", base+"/v1/chat/completions", chat(llama))
		if resp.StatusCode != 504 || time.Since(start) > 2*time.Second {
			t.Fatalf("route timeout: %d after %v: %q", resp.StatusCode, time.Since(start), e.Error.Message)
		}
	})
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	s, addr := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, addr)))
	ctx, cancel := context.WithCancel(context.Background())
	c := sdk(base)
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5000),
	}, option.WithJSONSet("ignore_eos", true))
	for i := 0; i < 3 && stream.Next(); i++ {
	}
	cancel()
	_ = stream.Close()
	waittest.Until(t, 3*time.Second, "the upstream sequence to be aborted", func() bool {
		resp, err := http.Get("http://" + s.Addr() + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		m, _ := io.ReadAll(resp.Body)
		return bytes.Contains(m, []byte(`vllm:request_success_total{engine="0",finished_reason="abort",model_name="`+llama+`"} 1`)) &&
			bytes.Contains(m, []byte(`vllm:num_requests_running{engine="0",model_name="`+llama+`"} 0`)) &&
			counter(t, g, "kvgate_endpoint_in_flight") == 0 && counter(t, g, "kvgate_requests_total", "code", "499") == 1
	})
}

func TestClientCannotPickThePod(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		got <- r.Header.Clone()
		_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}))
	defer up.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		t.Error("the client's chosen pod was used")
	}))
	defer other.Close()
	addr := strings.TrimPrefix(up.URL, "http://")
	_, base := startGateway(t, gatewayConfig(scheduler("p", "m", addr)))
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat("m"),
		"X-Gateway-Destination-Endpoint", strings.TrimPrefix(other.URL, "http://"),
		"X-Gateway-Destination-Endpoint-Subset", "1.2.3.4:5", "X-Kvgate-Internal", "x", "X-Request-Id", "client-id-1")
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Endpoint") != addr || resp.Header.Get("X-Request-Id") != "client-id-1" {
		t.Fatalf("%d endpoint %q id %q", resp.StatusCode, resp.Header.Get("X-Kvgate-Endpoint"), resp.Header.Get("X-Request-Id"))
	}
	h := <-got
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-gateway-destination") || strings.HasPrefix(strings.ToLower(k), "x-kvgate") {
			t.Errorf("control header %s reached the model server", k)
		}
	}
	if h.Get("X-Request-Id") != "client-id-1" || h.Get("X-Forwarded-For") == "" {
		t.Errorf("upstream headers %v", h)
	}
}

func TestExplainHeader(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, a, b)))
	// Both scraped, so neither is filtered out as unhealthy.
	waittest.Until(t, 5*time.Second, "both scraped", func() bool {
		s := g.Snapshot([]string{a, b})
		return s[0].Healthy && s[1].Healthy
	})
	resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), "X-Kvgate-Explain", "1")
	scores := resp.Header.Get("X-Kvgate-Scores")
	if !strings.Contains(scores, a) || !strings.Contains(scores, b) || !strings.Contains(scores, "kvCache=") || !strings.Contains(scores, "queue=") {
		t.Fatalf("x-kvgate-scores %q", scores)
	}
	resp, _, _ = call(t, "POST", base+"/v1/chat/completions", chat(llama))
	if resp.Header.Get("X-Kvgate-Scores") != "" {
		t.Error("scores sent without being asked for")
	}
}

// Concurrent streams through one gateway all complete, and the in-flight gauge
// returns to zero.
func TestManyConcurrentStreams(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, a, b)))
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 200 {
		wg.Go(func() {
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chat(llama, `"stream":true`, `"max_tokens":20`, `"ignore_eos":true`)))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			n := 0
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"content":" `) {
					n++
				}
			}
			if n != 20 {
				errs <- fmt.Errorf("%d tokens", n)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := counter(t, g, "kvgate_endpoint_in_flight"); got != 0 {
		t.Errorf("in flight after all finished: %v", got)
	}
	if got := counter(t, g, "kvgate_time_to_first_token_seconds"); got != 200 {
		t.Errorf("TTFT samples %v", got)
	}
}

// A scheduler with appProtocol kubernetes.io/h2c reaches its servers over HTTP/2
// without TLS; the default is HTTP/1.1.
func TestUpstreamProtocols(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		w.Header().Set("X-Upstream-Proto", r.Proto)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}))
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	up.Config.Protocols = &p
	up.Start()
	defer up.Close()
	addr := strings.TrimPrefix(up.URL, "http://")
	h2 := scheduler("h2", "m2", addr)
	h2.AppProtocol = v1alpha1.AppProtocolH2C
	_, base := startGateway(t, gatewayConfig(scheduler("h1", "m1", addr), h2))
	for model, want := range map[string]string{"m1": "HTTP/1.1", "m2": "HTTP/2.0"} {
		resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(model))
		if got := resp.Header.Get("X-Upstream-Proto"); resp.StatusCode != 200 || got != want {
			t.Errorf("%s: status %d over %q, want %s", model, resp.StatusCode, got, want)
		}
	}
}

// A JSON (non-streaming) answer past the relay's buffer that breaks once part
// of it went out cuts the client's connection, so a truncated body is never
// taken for a whole one, and the endpoint's in-flight count still returns to
// zero. (One that breaks within the buffer is retried: TestFaultJSONCut.)
func TestBrokenJSONBodyCutsConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100000")
		_, _ = w.Write([]byte(`{"choices":[` + strings.Repeat(" ", 40000)))
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer up.Close()
	g, base := startGateway(t, gatewayConfig(scheduler("p", "m", strings.TrimPrefix(up.URL, "http://"))))
	// The client sees an error: on the request when nothing was flushed yet, or on
	// reading the body otherwise.
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chat("m")))
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("a truncated JSON body read as complete")
	}
	waittest.Until(t, 2*time.Second, "the in-flight count to return to zero", func() bool {
		return counter(t, g, "kvgate_endpoint_in_flight") == 0 && counter(t, g, "kvgate_stream_errors_total") == 1
	})
}
