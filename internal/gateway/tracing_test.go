package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/tracing/tracingtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// headerSeen records a request header per request a server received.
type headerSeen struct {
	mu  sync.Mutex
	got []string
}

func (h *headerSeen) add(v string) { h.mu.Lock(); h.got = append(h.got, v); h.mu.Unlock() }

func (h *headerSeen) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// startSimSeeing runs a simulated model server behind a handler recording
// the traceparent of each completion request.
func startSimSeeing(t *testing.T, model string, seen *headerSeen) string {
	t.Helper()
	s, err := simserver.New(simserver.Options{Model: model, Logger: quiet, Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			seen.add(r.Header.Get("Traceparent"))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// busy answers every completion 503 (its scrapes 404), recording the
// traceparent it received.
func busy(t *testing.T, seen *headerSeen, calls *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notMetrics(w, r) {
			return
		}
		calls.Add(1)
		seen.add(r.Header.Get("Traceparent"))
		http.Error(w, `{"error":{"message":"busy","type":"server_error","code":503}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// tracedGateway wires tracing as kvgate serve does: the OTLP exporter from
// the OTEL_* environment, pointed at rcv.
func tracedGateway(t *testing.T, rcv *tracingtest.Receiver, accessLog *syncBuffer) func(*setup) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.Endpoint)
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	p, err := tracing.New(context.Background(), tracing.Options{Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	al, err := tracing.NewAccessLog(slog.New(slog.NewJSONHandler(accessLog, nil)), "on")
	if err != nil {
		t.Fatal(err)
	}
	return func(o *setup) { o.Tracing, o.AccessLog = p, al }
}

// syncBuffer serialises the access log's writes with the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// TestTracingRetriedStream: a streaming request whose first endpoint answers
// 503 and whose second streams is exported as one trace: the request's server
// span (the client's traceparent its parent, when it sent one) with the
// routing decision, a failed attempt span and a served one carrying the first
// token; each model server received a traceparent naming its attempt's span.
// The access log has the request's line.
func TestTracingRetriedStream(t *testing.T) {
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, tc := range []struct {
		name        string
		traceparent string // the client's, "" for none
	}{
		{"client traceparent", "00-" + clientTrace + "-" + clientSpan + "-01"},
		{"no traceparent", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := tracingtest.Start(t)
			var logged syncBuffer
			var failedSeen, servedSeen headerSeen
			var busyCalls atomic.Int64
			bad := busy(t, &failedSeen, &busyCalls)
			good := startSimSeeing(t, llama, &servedSeen)
			sc := scheduler("p", llama, bad, good)
			sc.Picker = "round-robin" // the first request goes to bad first
			withTracing := tracedGateway(t, rcv, &logged)
			g, base := startGateway(t, gatewayConfig(sc), withTracing)

			opts := []option.RequestOption{option.WithRequestTimeout(20 * time.Second), option.WithHeader("X-Request-Id", "trace-me")}
			if tc.traceparent != "" {
				opts = append(opts, option.WithHeader("Traceparent", tc.traceparent))
			}
			client := sdk(base, opts...)
			s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(4),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
			content := ""
			for s.Next() {
				if len(s.Current().Choices) > 0 {
					content += s.Current().Choices[0].Delta.Content
				}
			}
			if s.Err() != nil || content == "" || busyCalls.Load() != 1 {
				t.Fatalf("stream: err %v, content %q, the 503 endpoint called %d times (want 1: a retried request)", s.Err(), content, busyCalls.Load())
			}

			p := g.front.opts.Tracing
			flush := func() { _ = p.Flush(context.Background()) }
			spans := rcv.Wait(t, 10*time.Second, flush, func(s tracingtest.Span) bool { return s.Kind == tracepb.Span_SPAN_KIND_SERVER })
			var req tracingtest.Span
			var attempts []tracingtest.Span
			for _, s := range spans {
				switch s.Kind {
				case tracepb.Span_SPAN_KIND_SERVER:
					req = s
				case tracepb.Span_SPAN_KIND_CLIENT:
					attempts = append(attempts, s)
				}
			}
			if len(spans) != 3 || len(attempts) != 2 {
				t.Fatalf("spans: %d (%d attempts), want the request's and two attempts", len(spans), len(attempts))
			}
			if req.Service != tracing.DefaultServiceName || req.Name != "POST /v1/chat/completions" {
				t.Errorf("request span %q of service %q", req.Name, req.Service)
			}
			if tc.traceparent != "" && (req.TraceID() != clientTrace || req.ParentID() != clientSpan) {
				t.Errorf("request span in trace %s under %s; want the client's trace %s under %s", req.TraceID(), req.ParentID(), clientTrace, clientSpan)
			}
			if tc.traceparent == "" && req.ParentID() != "" {
				t.Errorf("request span has parent %s; want a root", req.ParentID())
			}
			for k, want := range map[string]any{
				"http.request.method": "POST", "url.path": "/v1/chat/completions", "http.response.status_code": int64(200),
				"gen_ai.operation.name": "chat", "gen_ai.request.model": llama, "kvgate.request_id": "trace-me",
				"kvgate.scheduler": "p", "kvgate.endpoint": good, "kvgate.winner": bad, "kvgate.candidates": int64(2), "kvgate.retries": int64(1),
				"kvgate.retry.reason": "status",
			} {
				if got := req.Attr(k); got != want {
					t.Errorf("request span %s = %v, want %v", k, got, want)
				}
			}
			if ttft, _ := req.Attr("gen_ai.server.time_to_first_token").(float64); ttft <= 0 {
				t.Errorf("request span's time to first token %v", req.Attr("gen_ai.server.time_to_first_token"))
			}
			if out, _ := req.Attr("gen_ai.usage.output_tokens").(int64); out <= 0 {
				t.Errorf("request span's output tokens %v", req.Attr("gen_ai.usage.output_tokens"))
			}
			if scores, _ := req.Attr("kvgate.scores").(string); !strings.Contains(scores, good) {
				t.Errorf("request span's scores %q name no candidate", scores)
			}
			if req.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
				t.Errorf("request span in error: %v", req.Status)
			}
			byAttempt := map[int64]tracingtest.Span{}
			for _, a := range attempts {
				n, _ := a.Attr("kvgate.attempt").(int64)
				byAttempt[n] = a
				if a.TraceID() != req.TraceID() || a.ParentID() != req.SpanID() {
					t.Errorf("attempt %d in trace %s under %s; want a child of the request span %s/%s", n, a.TraceID(), a.ParentID(), req.TraceID(), req.SpanID())
				}
			}
			failed, served := byAttempt[0], byAttempt[1]
			if failed.Span == nil || served.Span == nil {
				t.Fatalf("attempts numbered %v, want 0 and 1", byAttempt)
			}
			if failed.Attr("kvgate.endpoint") != bad || failed.Attr("http.response.status_code") != int64(503) ||
				failed.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || failed.Attr("kvgate.retry.reason") != "status" || failed.HasEvent(tracing.EventFirstToken) {
				t.Errorf("failed attempt: endpoint %v, status %v, span status %v, reason %v", failed.Attr("kvgate.endpoint"), failed.Attr("http.response.status_code"), failed.Status, failed.Attr("kvgate.retry.reason"))
			}
			if served.Attr("kvgate.endpoint") != good || served.Attr("http.response.status_code") != int64(200) || served.Attr("server.address") != "127.0.0.1" ||
				served.Attr("http.request.resend_count") != int64(1) || served.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR || !served.HasEvent(tracing.EventFirstToken) {
				t.Errorf("served attempt: endpoint %v, status %v, address %v, resend %v, span status %v, first token event %v", served.Attr("kvgate.endpoint"),
					served.Attr("http.response.status_code"), served.Attr("server.address"), served.Attr("http.request.resend_count"), served.Status, served.HasEvent(tracing.EventFirstToken))
			}
			// Each model server saw its attempt's span as the parent, in the trace.
			for _, c := range []struct {
				seen *headerSeen
				span tracingtest.Span
			}{{&failedSeen, failed}, {&servedSeen, served}} {
				want := "00-" + req.TraceID() + "-" + c.span.SpanID() + "-01"
				if got := c.seen.all(); len(got) != 1 || got[0] != want {
					t.Errorf("model server received traceparent %q, want [%s]", got, want)
				}
			}

			// One access-log line, with the trace's id.
			var line map[string]any
			waittest.Until(t, 5*time.Second, "the access-log line", func() bool {
				return json.Unmarshal(logged.Bytes(), &line) == nil
			})
			for k, want := range map[string]any{
				"msg": "request", "request_id": "trace-me", "gen_ai.request.model": llama, "gen_ai.operation.name": "chat",
				"kvgate.scheduler": "p", "kvgate.endpoint": good, "http.response.status_code": 200.0, "kvgate.retries": 1.0,
				"trace_id": req.TraceID(),
			} {
				if line[k] != want {
					t.Errorf("access log %s = %v, want %v (line %v)", k, line[k], want, line)
				}
			}
			for _, k := range []string{"gen_ai.server.time_to_first_token", "duration", "gen_ai.usage.output_tokens", "gen_ai.usage.input_tokens"} {
				if v, _ := line[k].(float64); v <= 0 {
					t.Errorf("access log %s = %v, want > 0", k, line[k])
				}
			}
		})
	}
}

// TestTracingOff: without --tracing the client's traceparent reaches the model
// server unchanged, and the access log still has the request's line, with no
// trace id.
func TestTracingOff(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name      string
		accessLog string
		lines     int
	}{{"access log on", "on", 1}, {"everything off", "off", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			var seen headerSeen
			good := startSimSeeing(t, llama, &seen)
			var logged syncBuffer
			al, err := tracing.NewAccessLog(slog.New(slog.NewJSONHandler(&logged, nil)), tc.accessLog)
			if err != nil {
				t.Fatal(err)
			}
			_, base := startGateway(t, gatewayConfig(scheduler("p", llama, good)), func(o *setup) { o.AccessLog = al })
			resp, _, _ := call(t, "POST", base+"/v1/chat/completions", chat(llama), "Traceparent", tp, "X-Request-Id", "untraced")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := seen.all(); len(got) != 1 || got[0] != tp {
				t.Errorf("model server received traceparent %q, want the client's %q", got, tp)
			}
			var lines []map[string]any
			waittest.Until(t, 5*time.Second, "the access log", func() bool {
				lines = nil
				for _, l := range bytes.Split(bytes.TrimSpace(logged.Bytes()), []byte("\n")) {
					var m map[string]any
					if json.Unmarshal(l, &m) == nil {
						lines = append(lines, m)
					}
				}
				return len(lines) >= tc.lines
			})
			if len(lines) != tc.lines {
				t.Fatalf("%d access-log lines, want %d", len(lines), tc.lines)
			}
			for _, l := range lines {
				if l["request_id"] != "untraced" || l["kvgate.endpoint"] != good || l["trace_id"] != nil {
					t.Errorf("access log line %v", l)
				}
			}
		})
	}
}
