package global

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/tracing/tracingtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// startTracedTier1 is startTier1 with the gateway's spans exported by p.
func startTracedTier1(t *testing.T, p *tracing.Provider) *tier1 {
	t.Helper()
	ep := simtest.Start(t, simserver.Options{Model: llama}).Addr()
	g := host.New(host.CoreOptions{Logger: quiet})
	t.Cleanup(g.Close)
	front := gateway.New(g.Router(), gateway.Options{Logger: quiet, Tracing: p})
	cfg := &v1alpha1.InferenceGatewayConfig{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "t1"},
		Spec:       v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true}, Schedulers: []v1alpha1.SchedulerSpec{{Name: "llama", ModelName: llama, Endpoints: []string{ep}}}}}
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	m := &tier1{t: t, host: g, front: front}
	m.serve("127.0.0.1:0", "127.0.0.1:0")
	t.Cleanup(m.kill)
	return m
}

// TestTracingAcrossTiers: kvgate global in front of a tier-1 gateway, both
// exporting spans, makes one trace: tier 1's request span is the child of
// tier 2's attempt span (the traceparent tier 2 sent), its own attempt span
// under it.
func TestTracingAcrossTiers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"stream", true}, {"whole answer", false}} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := tracingtest.Start(t)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.Endpoint)
			providers := map[string]*tracing.Provider{}
			for _, name := range []string{"kvgate", "kvgate-global"} {
				p, err := tracing.New(context.Background(), tracing.Options{Enabled: true, ServiceName: name})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
				providers[name] = p
			}
			m := startTracedTier1(t, providers["kvgate"])
			var logged lockedBuffer
			al, err := tracing.NewAccessLog(slog.New(slog.NewJSONHandler(&logged, nil)), "on")
			if err != nil {
				t.Fatal(err)
			}
			_, base := startRouter(t, routerConfig(steadyRouting(), m.member("east", 1)), Options{Tracing: providers["kvgate-global"], AccessLog: al})

			client := sdk(base)
			params := openai.ChatCompletionNewParams{Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(4)}
			if tc.stream {
				s := client.Chat.Completions.NewStreaming(context.Background(), params)
				for s.Next() {
				}
				if s.Err() != nil {
					t.Fatal(s.Err())
				}
			} else if _, err := client.Chat.Completions.New(context.Background(), params); err != nil {
				t.Fatal(err)
			}

			flush := func() {
				for _, p := range providers {
					_ = p.Flush(context.Background())
				}
			}
			isServer := func(service string) func(tracingtest.Span) bool {
				return func(s tracingtest.Span) bool { return s.Service == service && s.Kind == tracepb.Span_SPAN_KIND_SERVER }
			}
			rcv.Wait(t, 10*time.Second, flush, isServer("kvgate-global"))
			spans := rcv.Wait(t, 10*time.Second, flush, isServer("kvgate"))
			find := func(service string, kind tracepb.Span_SpanKind) tracingtest.Span {
				t.Helper()
				var found []tracingtest.Span
				for _, s := range spans {
					if s.Service == service && s.Kind == kind {
						found = append(found, s)
					}
				}
				if len(found) != 1 {
					t.Fatalf("%d %s spans of %s, want 1 (of %d)", len(found), kind, service, len(spans))
				}
				return found[0]
			}
			t2, t2Attempt := find("kvgate-global", tracepb.Span_SPAN_KIND_SERVER), find("kvgate-global", tracepb.Span_SPAN_KIND_CLIENT)
			t1, t1Attempt := find("kvgate", tracepb.Span_SPAN_KIND_SERVER), find("kvgate", tracepb.Span_SPAN_KIND_CLIENT)
			for _, c := range []struct {
				name          string
				child, parent tracingtest.Span
			}{
				{"tier 2's attempt", t2Attempt, t2},
				{"tier 1's request", t1, t2Attempt},
				{"tier 1's attempt", t1Attempt, t1},
			} {
				if c.child.TraceID() != t2.TraceID() || c.child.ParentID() != c.parent.SpanID() {
					t.Errorf("%s span in trace %s under %s; want trace %s under %s", c.name, c.child.TraceID(), c.child.ParentID(), t2.TraceID(), c.parent.SpanID())
				}
			}
			if t2.ParentID() != "" {
				t.Errorf("tier 2's request span has parent %s; want a root", t2.ParentID())
			}
			if t2.Attr("kvgate.endpoint") != "east" || t2.Attr("kvgate.winner") != "east" || t2Attempt.Attr("kvgate.endpoint") != "east" || t2.Attr("kvgate.candidates") != int64(1) ||
				t2.Attr("http.response.status_code") != int64(200) || t2.Attr("gen_ai.request.model") != llama {
				t.Errorf("tier 2's spans: endpoint %v/%v, candidates %v, status %v, model %v", t2.Attr("kvgate.endpoint"), t2Attempt.Attr("kvgate.endpoint"),
					t2.Attr("kvgate.candidates"), t2.Attr("http.response.status_code"), t2.Attr("gen_ai.request.model"))
			}
			if t1.Attr("kvgate.scheduler") != "llama" || t1.Attr("http.response.status_code") != int64(200) {
				t.Errorf("tier 1's request span: scheduler %v, status %v", t1.Attr("kvgate.scheduler"), t1.Attr("http.response.status_code"))
			}
			if tc.stream && !t2Attempt.HasEvent(tracing.EventFirstToken) {
				t.Errorf("tier 2's attempt has no first-token event")
			}
			// Tier 2's access-log line names the member and the trace.
			var line map[string]any
			waittest.Until(t, 5*time.Second, "tier 2's access-log line", func() bool { return json.Unmarshal(logged.Bytes(), &line) == nil })
			for k, want := range map[string]any{"kvgate.endpoint": "east", "gen_ai.request.model": llama, "http.response.status_code": 200.0, "trace_id": t2.TraceID()} {
				if line[k] != want {
					t.Errorf("access log %s = %v, want %v", k, line[k], want)
				}
			}
		})
	}
}

// lockedBuffer serialises the access log's writes with the test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}
