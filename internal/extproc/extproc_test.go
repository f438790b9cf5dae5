package extproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

const llama = "meta-llama/Llama-3.1-8B-Instruct"

func startSims(t testing.TB, n int, opts simserver.Options) []string {
	t.Helper()
	opts.Model = llama
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = simtest.Start(t, opts).Addr()
	}
	return addrs
}

func pool(addrs ...string) v1alpha1.SchedulerSpec {
	return v1alpha1.SchedulerSpec{Name: "llama", ModelName: llama, Endpoints: addrs}
}

func (s *testServer) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Value(t, s.gw.Metrics().Registry, name, labels...)
}

// inFlightZero waits until no endpoint holds a request of this gateway.
func (s *testServer) inFlightZero(t testing.TB) {
	t.Helper()
	waittest.Until(t, 10*time.Second, "every endpoint released", func() bool { return s.metric(t, "kvgate_endpoint_in_flight") == 0 })
}

func chatBody(model, content string, extra ...string) []byte {
	c, _ := json.Marshal(content)
	s := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(c) + `}],"max_tokens":8`
	for _, e := range extra {
		s += "," + e
	}
	return []byte(s + "}")
}

// TestPickAndStream: a request goes through the whole protocol to a real
// simulated model server and back; body and response pass byte-identical, the
// destination is a ranked list with fallbacks, control headers are stripped, and
// the response is counted in the same metrics as `serve`.
func TestPickAndStream(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{Fallbacks: -1})
	for _, tc := range []struct {
		name   string
		body   []byte
		sse    bool
		tokens bool
	}{
		{"json", chatBody(llama, "hello there"), false, true},
		{"sse with usage", chatBody(llama, "hello there", `"stream":true`, `"stream_options":{"include_usage":true}`), true, true},
		{"sse without usage", chatBody(llama, "hello there", `"stream":true`), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.metric(t, "kvgate_tokens_total", "kind", "completion")
			p := s.play(t, request{body: tc.body, headers: map[string]string{
				"x-gateway-inference-objective": "chat", "x-gateway-destination-endpoint-subset": "10.9.9.9:1", "x-kvgate-explain": "1",
				"x-gateway-inference-fairness-id": "tenant-a", "x-gateway-model-name-rewrite": "other"}})
			dest := p.destination(t)
			if len(dest) != 2 || !slices.Contains(addrs, dest[0]) || !slices.Contains(addrs, dest[1]) || dest[0] == dest[1] {
				t.Fatalf("destination %v: want both endpoints, the pick first", dest)
			}
			rm := p.headers.GetHeaderMutation().GetRemoveHeaders()
			for _, h := range []string{"x-gateway-inference-objective", "x-gateway-destination-endpoint-subset", "x-kvgate-explain", "x-gateway-inference-fairness-id", "x-gateway-model-name-rewrite"} {
				if !slices.Contains(rm, h) {
					t.Errorf("control header %s not stripped (removed: %v)", h, rm)
				}
			}
			if id, ok := setHeader(p.headers, requestIDHeader); !ok || len(id) < 16 {
				t.Errorf("no x-request-id generated: %q", id)
			}
			if !bytes.Equal(p.upstreamBody, tc.body) || p.reqEOS != 1 {
				t.Fatalf("upstream got %q (eos %d), want the body unchanged with one end of stream", p.upstreamBody, p.reqEOS)
			}
			if p.status != 200 || len(p.upstreamResp) == 0 || !bytes.Equal(p.clientResp, p.upstreamResp) || p.respEOS != 1 {
				t.Fatalf("status %d; response passed %d of %d bytes unchanged=%v, eos %d", p.status, len(p.clientResp), len(p.upstreamResp),
					bytes.Equal(p.clientResp, p.upstreamResp), p.respEOS)
			}
			if sse := bytes.HasPrefix(p.upstreamResp, []byte("data: ")); sse != tc.sse {
				t.Fatalf("response is SSE: %v, want %v", sse, tc.sse)
			}
			if v, _ := setHeader(p.respHeaders, endpointHeader); v != dest[0] {
				t.Errorf("x-kvgate-endpoint %q, want %q", v, dest[0])
			}
			waittest.Until(t, 10*time.Second, "the request counted", func() bool {
				return s.metric(t, "kvgate_requests_total", "endpoint", dest[0], "code", "200", "scheduler", "llama", "model", llama) >= 1
			})
			got := s.metric(t, "kvgate_tokens_total", "kind", "completion") - before
			if tc.tokens && got != 8 || !tc.tokens && got != 0 {
				t.Errorf("completion tokens counted %v (usage in response: %v)", got, tc.tokens)
			}
			s.inFlightZero(t)
		})
	}
	if n := s.metric(t, "kvgate_time_to_first_token_seconds"); n != 3 {
		t.Errorf("TTFT observed %v times, want 3", n)
	}
	if n := s.metric(t, "kvgate_extproc_streams_total", "outcome", "routed"); n != 3 {
		t.Errorf("routed streams %v, want 3", n)
	}
}

// TestRefusals: every request the picker cannot route ends in an immediate
// response with the right status and an OpenAI error body, and nothing else.
func TestRefusals(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	limit := int64(4096)
	cfg := gatewayConfig(pool(addrs...))
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	s := startServer(t, cfg, Options{Fallbacks: -1})
	big := chatBody(llama, strings.Repeat("x", 5000))
	for _, tc := range []struct {
		name   string
		req    request
		status int
		msg    string
	}{
		{"no model", request{body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`)}, 400, "no matching model"},
		{"unknown model", request{body: chatBody("gpt-9", "hi")}, 404, "no matching model"},
		{"unknown model in header", request{method: "GET", path: "/v1/models", headers: map[string]string{ModelHeader: "gpt-9"}}, 404, "no matching model"},
		{"malformed JSON", request{body: []byte(`{"model" "x"}`)}, 400, "malformed JSON"},
		{"not an object", request{body: []byte(`["model"]`)}, 400, "JSON object"},
		{"model not a string", request{body: []byte(`{"model":42}`)}, 400, "'model' must be"},
		{"truncated body", request{body: []byte(`{"messages":[{"role":"user","content":"hi`)}, 400, "end of body"},
		{"too large, one chunk, no content-length", request{body: big, headers: map[string]string{"content-length": ""}}, 413, "exceeds 4096 bytes"},
		{"empty subset hint", request{body: chatBody(llama, "hi"), subset: []string{}}, 503, "subset"},
		{"subset of strangers", request{body: chatBody(llama, "hi"), subset: []string{"10.1.2.3:8000"}}, 503, "subset"},
		{"too large by content-length", request{body: big}, 413, "exceeds 4096 bytes"},
		{"too large, chunked", request{body: big, headers: map[string]string{"content-length": ""}, cuts: []int{1000, 1000, 1000, 1000}}, 413, "exceeds 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.play(t, tc.req)
			ir := p.immediate
			if ir == nil {
				t.Fatalf("no immediate response (headers response: %v)", p.headers)
			}
			if int(ir.GetStatus().GetCode()) != tc.status {
				t.Fatalf("status %d, want %d (%s)", ir.GetStatus().GetCode(), tc.status, ir.GetBody())
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("body %s: want an OpenAI error with code %d mentioning %q", ir.GetBody(), tc.status, tc.msg)
			}
			if ct, _ := mutationValue(ir.GetHeaders(), "content-type"); ct != "application/json" {
				t.Errorf("content-type %q", ct)
			}
			if p.headers != nil || len(p.upstreamBody) > 0 {
				t.Fatalf("a refused request must get only the immediate response")
			}
		})
	}
	s.inFlightZero(t)
	if n := s.metric(t, "kvgate_requests_total", "code", "400"); n != 5 {
		t.Errorf("400s counted %v, want 5", n)
	}
}

// TestSaturated: with every endpoint at its in-flight limit, a request waits the
// queue timeout and gets 429 with Retry-After; once a slot frees it routes.
func TestSaturated(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	one := int32(1)
	cfg := gatewayConfig(pool(addrs...))
	cfg.Spec.Gateway.MaxInFlightPerEndpoint = &one
	cfg.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: 50 * time.Millisecond}
	s := startServer(t, cfg, Options{})
	// Hold the only slot: picked, response not yet started.
	cancel, stream := s.open(t)
	sendRequest(t, stream, chatBody(llama, "hi"))
	if r, err := stream.Recv(); err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("first request not picked: %v %v", r, err)
	}
	p := s.play(t, request{body: chatBody(llama, "hi")})
	if p.immediate == nil || p.immediate.GetStatus().GetCode() != 429 {
		t.Fatalf("want 429 while saturated, got %v", p.immediate)
	}
	if ra, _ := mutationValue(p.immediate.GetHeaders(), "retry-after"); ra == "" {
		t.Error("429 without retry-after")
	}
	// A sheddable objective is refused without waiting the queue timeout.
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}}
	cfg.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: 10 * time.Second}
	if err := s.gw.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p = s.play(t, request{body: chatBody(llama, "hi"), headers: map[string]string{"x-gateway-inference-objective": "batch"}})
	if p.immediate == nil || p.immediate.GetStatus().GetCode() != 429 || time.Since(start) > 5*time.Second {
		t.Fatalf("sheddable while saturated: %v after %v, want an immediate 429", p.immediate, time.Since(start))
	}
	cancel() // the first request's client goes away
	s.inFlightZero(t)
	if p := s.play(t, request{body: chatBody(llama, "hi")}); p.status != 200 {
		t.Fatalf("after the slot freed: status %d, immediate %v", p.status, p.immediate)
	}
}

// TestSubsetHint: the pick comes only from the proxy's subset.
func TestSubsetHint(t *testing.T) {
	addrs := startSims(t, 3, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{Fallbacks: -1})
	for i := range 6 {
		want := addrs[i%3]
		p := s.play(t, request{body: chatBody(llama, "hi"), subset: []string{want, "10.0.0.99:8000"}, noUpstream: true})
		if dest := p.destination(t); len(dest) != 1 || dest[0] != want {
			t.Fatalf("subset [%s]: destination %v", want, dest)
		}
	}
	s.inFlightZero(t)
}

// TestLargeBodies: bodies over 1 MB, cut at random chunk boundaries (seeded and
// logged), with the model first or last, ended by a chunk, an empty chunk or
// trailers, sometimes with a duplicate end of stream: the body reaches the
// upstream byte-identical, with exactly one end of stream, and a leading model
// is picked on before the body's end has been sent.
func TestLargeBodies(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 24000) // ~1.08 MB
	modelFirst := chatBody(llama, content)
	modelLast := []byte(`{"messages":[{"role":"user","content":` + mustJSON(content) + `}],"max_tokens":8,"model":"` + llama + `"}`)
	duplicates := 0
	for i := range 12 {
		body := modelFirst
		if i%2 == 1 {
			body = modelLast
		}
		var cuts []int
		for total := 0; total < len(body); {
			n := 1 + rng.IntN(64<<10)
			if rng.IntN(8) == 0 {
				n = 1 + rng.IntN(16)
			}
			cuts = append(cuts, n)
			total += n
		}
		end := []string{"chunk", "empty chunk", "trailers"}[i%3]
		if end == "empty chunk" {
			cuts = append(cuts, 0)
		}
		req := request{body: body, cuts: cuts, trailers: end == "trailers", duplicateEOS: i%4 == 3 && end != "trailers", noUpstream: true}
		if i%2 == 0 {
			req.holdAfter = 256 << 10 // the pick must come before the rest is sent
		}
		if req.duplicateEOS {
			duplicates++
		}
		name := fmt.Sprintf("%d model %s, %d chunks, %s, duplicate %v", i, map[bool]string{true: "first", false: "last"}[i%2 == 0], len(cuts), end, req.duplicateEOS)
		t.Run(name, func(t *testing.T) {
			p := s.play(t, req)
			dest := p.destination(t)
			if !slices.Contains(addrs, dest[0]) {
				t.Fatalf("destination %v", dest)
			}
			if !bytes.Equal(p.upstreamBody, body) {
				t.Fatalf("upstream body differs: %d bytes, want %d (seed %d)", len(p.upstreamBody), len(body), seed)
			}
			if req.trailers {
				if p.reqEOS != 0 || !p.reqTrailers {
					t.Fatalf("trailers: eos flags %d, trailers answered %v", p.reqEOS, p.reqTrailers)
				}
			} else if p.reqEOS != 1 {
				t.Fatalf("%d end-of-stream flags, want 1", p.reqEOS)
			}
		})
	}
	if n := s.metric(t, "kvgate_extproc_duplicate_eos_total", "direction", "request"); n != float64(duplicates) {
		t.Errorf("duplicate end-of-stream chunks counted %v, want %d", n, duplicates)
	}
	s.inFlightZero(t)
}

// TestDuplicateEOSThenResponse: after a duplicated last chunk of a large body
// the exchange goes on normally through the model server's answer.
func TestDuplicateEOSThenResponse(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	body := chatBody(llama, strings.Repeat("lorem ipsum ", 30000)[:300000], `"stream":true`)
	cuts := []int{}
	for range len(body)/60000 + 1 {
		cuts = append(cuts, 60000)
	}
	p := s.play(t, request{body: body, cuts: cuts, duplicateEOS: true})
	if p.status != 200 || !bytes.Equal(p.clientResp, p.upstreamResp) || !bytes.Contains(p.clientResp, []byte("[DONE]")) {
		t.Fatalf("status %d, response intact %v", p.status, bytes.Equal(p.clientResp, p.upstreamResp))
	}
	if !bytes.Equal(p.upstreamBody, body) {
		t.Fatal("body changed")
	}
	s.inFlightZero(t)
}

// TestAborts: a stream that ends at any point — before the pick, after it,
// mid-response, or half-closed mid-body — returns promptly, releases its
// endpoint and leaves no goroutine behind.
func TestAborts(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	late := []byte(`{"messages":[{"role":"user","content":` + mustJSON(strings.Repeat("a", 200000)) + `}],"model":"` + llama + `"}`)
	long := chatBody(llama, "write", `"stream":true`, `"max_tokens":2000`, `"ignore_eos":true`)
	for _, tc := range []struct {
		name string
		req  request
		code string // the request's status in the metrics, "" when it never had a pool
	}{
		{"before the pick", request{body: late, cuts: []int{1000, 1000, 1000}, abortAfterChunks: 2}, ""},
		{"half-closed mid-body", request{body: late, cuts: []int{1000, 1000, 1000}, closeAfterChunks: 2}, ""},
		{"after the pick", request{body: chatBody(llama, "hi"), noUpstream: true}, "unseen"},
		{"mid-response", request{body: long, abortMidResponse: 3}, "stream_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.metric(t, "kvgate_requests_total", "code", tc.code)
			start := time.Now()
			p := s.play(t, tc.req)
			if time.Since(start) > 5*time.Second {
				t.Fatalf("took %v", time.Since(start))
			}
			if p.immediate != nil {
				t.Fatalf("immediate response %v", p.immediate)
			}
			s.inFlightZero(t)
			if tc.code != "" {
				waittest.Until(t, 10*time.Second, "the aborted request counted", func() bool { return s.metric(t, "kvgate_requests_total", "code", tc.code) == before+1 })
			}
		})
	}
	waittest.Until(t, 10*time.Second, "every stream's handler returned", func() bool { return processing() == 0 })
	if n := s.metric(t, "kvgate_extproc_streams_total", "outcome", "aborted"); n != 2 {
		t.Errorf("aborted streams %v, want 2 (the other two were routed)", n)
	}
	// An ext_proc stream cannot tell a client abort from a broken upstream: the
	// response that ended early counts as a stream error either way.
	if n := s.metric(t, "kvgate_stream_errors_total"); n != 1 {
		t.Errorf("stream errors %v, want 1 (the response cut mid-way)", n)
	}
}

// TestHeaderModel: with the model in x-gateway-model-name (set by a body-based
// router) and no prefix scoring, the pick comes with the headers, before any
// body byte; a bodiless request is routed by the header alone, or without one
// to the only pool.
func TestHeaderModel(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	sc := pool(addrs...)
	sc.Picker = "least-request"
	s := startServer(t, gatewayConfig(sc), Options{})
	p := s.play(t, request{body: chatBody(llama, "hi"), headers: map[string]string{ModelHeader: llama}, pickBeforeBody: true})
	if p.status != 200 {
		t.Fatalf("status %d", p.status)
	}
	for _, h := range []map[string]string{{ModelHeader: llama}, nil} {
		p = s.play(t, request{method: "GET", path: "/v1/models", headers: h})
		if dest := p.destination(t); !slices.Contains(addrs, dest[0]) || p.status != 200 {
			t.Fatalf("bodiless request (headers %v): destination %v status %d", h, dest, p.status)
		}
	}
}

// TestObservabilityMode: in observability mode the processor answers nothing,
// picks nothing and counts no request, whatever the body mode.
func TestObservabilityMode(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_STREAMED} {
		p := s.play(t, request{body: chatBody(llama, "hi"), observability: true,
			modes: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode}})
		if p.answers != 0 || p.serverErr != nil {
			t.Fatalf("%v: %d answers (err %v), want none", mode, p.answers, p.serverErr)
		}
	}
	if n := s.metric(t, "kvgate_requests_total"); n != 0 {
		t.Errorf("%v requests counted", n)
	}
	if n := s.metric(t, "kvgate_extproc_streams_total", "outcome", "observed"); n != 2 {
		t.Errorf("observed streams %v, want 2", n)
	}
}

// TestResponseBodyNone: with Envoy configured not to send the response body
// (response_body_mode NONE, announced in the protocol configuration), a
// response is counted by its status when its headers pass.
func TestResponseBodyNone(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	p := s.play(t, request{body: chatBody(llama, "hi", `"stream":true`), modes: &extprocv3.ProtocolConfiguration{
		RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_NONE}})
	if p.status != 200 || !bytes.Contains(p.upstreamResp, []byte("[DONE]")) {
		t.Fatalf("status %d", p.status)
	}
	waittest.Until(t, 10*time.Second, "the request counted with its status", func() bool {
		return s.metric(t, "kvgate_requests_total", "code", "200", "endpoint", addrs[0]) == 1
	})
	if n := s.metric(t, "kvgate_requests_total"); n != 1 {
		t.Errorf("%v requests counted, want 1", n)
	}
	s.inFlightZero(t)
}

// TestRefusedAfterPick: a body that outgrows the limit after the pick (the model
// came in a header, so the pick came first) is refused with 413 and not counted
// against the endpoint, which never answered.
func TestRefusedAfterPick(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	limit := int64(4096)
	sc := pool(addrs...)
	sc.Picker = "least-request"
	cfg := gatewayConfig(sc)
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	s := startServer(t, cfg, Options{})
	p := s.play(t, request{body: chatBody(llama, strings.Repeat("y", 6000)), headers: map[string]string{ModelHeader: llama, "content-length": ""},
		cuts: slices.Repeat([]int{1000}, 7), pickBeforeBody: true})
	if p.headers == nil || p.immediate == nil || p.immediate.GetStatus().GetCode() != 413 {
		t.Fatalf("want a pick then 413, got headers %v immediate %v", p.headers != nil, p.immediate)
	}
	if n := s.metric(t, "kvgate_requests_total", "code", "413", "endpoint", ""); n != 1 {
		t.Errorf("413s without an endpoint %v, want 1", n)
	}
	s.inFlightZero(t)
}

// TestServedFallback: when Envoy reports it served the request from a fallback,
// the request is accounted to that endpoint.
func TestServedFallback(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{Fallbacks: -1})
	var picked string
	p := s.play(t, request{body: chatBody(llama, "hi"), served: func(dest []string) string { picked = dest[0]; return dest[1] }})
	other := p.destination(t)[1]
	if p.status != 200 || picked == other {
		t.Fatalf("status %d", p.status)
	}
	waittest.Until(t, 10*time.Second, "the request counted against the fallback", func() bool {
		return s.metric(t, "kvgate_requests_total", "endpoint", other, "code", "200") == 1
	})
	if n := s.metric(t, "kvgate_requests_total", "endpoint", picked); n != 0 {
		t.Errorf("the unused pick was counted %v requests", n)
	}
	if n := s.metric(t, "kvgate_retries_total", "reason", "fallback"); n != 1 {
		t.Errorf("fallbacks counted %v", n)
	}
	if v, _ := setHeader(p.respHeaders, endpointHeader); v != other {
		t.Errorf("x-kvgate-endpoint %q, want the fallback %q", v, other)
	}
	s.inFlightZero(t)
}

// TestPrefixAffinity: requests sharing a long prompt head go to the endpoint
// that already holds it, as with `serve`.
func TestPrefixAffinity(t *testing.T) {
	addrs := startSims(t, 3, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	shared := strings.Repeat("You are a careful assistant for the accounting team. ", 100)
	count := map[string]int{}
	for i := range 10 {
		p := s.play(t, request{body: chatBody(llama, shared+fmt.Sprintf(" Question %d?", i)), cuts: []int{700, 700, 700}})
		count[p.destination(t)[0]]++
	}
	best := 0
	for _, n := range count {
		best = max(best, n)
	}
	if best < 9 {
		t.Fatalf("shared prefix spread over %v", count)
	}
}

// processing counts the goroutines running a stream's handler.
func processing() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("extproc.(*Server).Process("))
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestSessionAffinity: the Endpoint Picker keeps a session on its pod as
// serve does, the key from a header Envoy forwards or the body's user field.
func TestSessionAffinity(t *testing.T) {
	addrs := startSims(t, 3, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	for _, tc := range []struct {
		name     string
		affinity v1alpha1.SessionAffinitySpec
		req      func(session string, i int) request
	}{
		{"header", v1alpha1.SessionAffinitySpec{Header: "x-conversation"}, func(session string, i int) request {
			return request{headers: map[string]string{"x-conversation": session}, body: chatBody(llama, fmt.Sprintf("turn %d", i))}
		}},
		{"user field", v1alpha1.SessionAffinitySpec{FromUser: true}, func(session string, i int) request {
			return request{body: chatBody(llama, fmt.Sprintf("turn %d", i), `"user":"`+session+`"`), cuts: []int{40}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := pool(addrs...)
			sc.SessionAffinity = &tc.affinity
			s := startServer(t, gatewayConfig(sc), Options{})
			homes := map[string]bool{}
			for _, session := range []string{"a", "b", "c", "d", "e", "f"} {
				home := s.play(t, tc.req(session, 0)).destination(t)[0]
				homes[home] = true
				for i := 1; i < 4; i++ {
					if got := s.play(t, tc.req(session, i)).destination(t)[0]; got != home {
						t.Fatalf("session %s went to %s, then %s", session, home, got)
					}
				}
			}
			if len(homes) < 2 {
				t.Errorf("six sessions all lived on %v: the key did not spread them", homes)
			}
		})
	}
}

// TestRequestIDHeader: a client's x-request-id passes on when it is one to
// pass on (proxy.ValidRequestID, as in kvgate serve); any other is replaced
// by a generated one, set on the request.
func TestRequestIDHeader(t *testing.T) {
	s := startServer(t, gatewayConfig(pool(startSims(t, 1, simserver.Options{})...)), Options{})
	for _, tc := range []struct {
		name, id string
		kept     bool
	}{
		{"kept", "client-id-1", true},
		{"128 characters kept", strings.Repeat("a", 128), true},
		{"none", "", false},
		{"too long", strings.Repeat("a", 129), false},
		{"space", "a b", false},
		{"non-ASCII", "idé", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.id != "" {
				h[requestIDHeader] = tc.id
			}
			p := s.play(t, request{body: chatBody(llama, "hello"), headers: h})
			id, set := setHeader(p.headers, requestIDHeader)
			switch {
			case tc.kept && set:
				t.Errorf("the client's id %q replaced by %q", tc.id, id)
			case !tc.kept && (!set || id == tc.id || !proxy.ValidRequestID(id)):
				t.Errorf("the client's id %q: set %v to %q, want a generated one", tc.id, set, id)
			}
		})
	}
}
