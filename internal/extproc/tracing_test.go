package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/tracing/tracingtest"
)

// TestTracingExchange: with tracing on, each exchange is a span — a child of
// the traceparent Envoy passed, with the pick and the response's status — and
// the request headers response sets the traceparent that the model server
// receives, naming that span.
func TestTracingExchange(t *testing.T) {
	const clientTrace, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	addrs := startSims(t, 2, simserver.Options{})
	rcv := tracingtest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.Endpoint)
	p, err := tracing.New(context.Background(), tracing.Options{Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{Tracing: p})
	for _, tc := range []struct {
		name        string
		traceparent string
		body        []byte
	}{
		{"stream under the client's trace", "00-" + clientTrace + "-" + clientSpan + "-01", chatBody(llama, "hello", `"stream":true`, `"stream_options":{"include_usage":true}`)},
		{"whole answer, new trace", "", chatBody(llama, "hello")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := map[string]string{"x-request-id": "epp-" + strings.ReplaceAll(tc.name, " ", "-")}
			if tc.traceparent != "" {
				headers["traceparent"] = tc.traceparent
			}
			played := s.play(t, request{body: tc.body, headers: headers})
			dest := played.destination(t)
			if played.status != 200 {
				t.Fatalf("status %d", played.status)
			}
			sent, ok := setHeader(played.headers, "traceparent")
			if !ok {
				t.Fatal("no traceparent set on the request to the model server")
			}
			rid := headers["x-request-id"]
			isSpan := func(sp tracingtest.Span) bool { return sp.Attr("kvgate.request_id") == rid }
			var span tracingtest.Span
			for _, sp := range rcv.Wait(t, 10*time.Second, func() { _ = p.Flush(context.Background()) }, isSpan) {
				if isSpan(sp) {
					span = sp
				}
			}
			if span.Kind != tracepb.Span_SPAN_KIND_SERVER || span.Name != "ext_proc /v1/chat/completions" {
				t.Errorf("span %q of kind %v", span.Name, span.Kind)
			}
			if want := "00-" + span.TraceID() + "-" + span.SpanID() + "-01"; sent != want {
				t.Errorf("traceparent set %q, want %q (the exchange's span)", sent, want)
			}
			if tc.traceparent != "" && (span.TraceID() != clientTrace || span.ParentID() != clientSpan) {
				t.Errorf("span in trace %s under %s, want %s under %s", span.TraceID(), span.ParentID(), clientTrace, clientSpan)
			}
			if tc.traceparent == "" && span.ParentID() != "" {
				t.Errorf("span has parent %s, want a root", span.ParentID())
			}
			for k, want := range map[string]any{"kvgate.scheduler": "llama", "gen_ai.request.model": llama, "kvgate.candidates": int64(2),
				"kvgate.winner": dest[0], "kvgate.endpoint": dest[0], "http.response.status_code": int64(200)} {
				if got := span.Attr(k); got != want {
					t.Errorf("span %s = %v, want %v", k, got, want)
				}
			}
		})
	}
}
