// Package tracingtest receives OTLP/HTTP trace exports for other packages'
// tests: a real HTTP server decoding the protobuf messages the SDK's exporter
// sends.
package tracingtest

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/internal/waittest"
)

// Span is a received span with the service that sent it.
type Span struct {
	*tracepb.Span
	Service string
}

// TraceID is the span's trace id in hex, as in a traceparent.
func (s Span) TraceID() string { return hex.EncodeToString(s.TraceId) }

// SpanID is the span's id in hex.
func (s Span) SpanID() string { return hex.EncodeToString(s.SpanId) }

// ParentID is the parent's span id in hex, "" for a root.
func (s Span) ParentID() string { return hex.EncodeToString(s.ParentSpanId) }

// Attr is the attribute's value, nil when it is absent: a string, int64,
// float64 or bool.
func (s Span) Attr(key string) any {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return value(kv.Value)
		}
	}
	return nil
}

// HasEvent says whether the span carries the named event.
func (s Span) HasEvent(name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return nil
}

// Receiver is an OTLP/HTTP trace endpoint: Endpoint is the URL to give
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
type Receiver struct {
	Endpoint string
	mu       sync.Mutex
	spans    []Span
	bad      []string
}

// Start serves a receiver until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	r.Endpoint = srv.URL + "/v1/traces"
	return r
}

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/x-protobuf" {
		r.fail(req.Method + " " + req.URL.Path + " " + req.Header.Get("Content-Type"))
		http.Error(w, "want POST /v1/traces in protobuf", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			r.fail("gzip: " + err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &msg)
	}
	if err != nil {
		r.fail("decoding: " + err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, Span{Span: s, Service: service})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) fail(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bad = append(r.bad, what)
}

// Spans returns the spans received so far, failing the test if an export
// could not be decoded.
func (r *Receiver) Spans(t testing.TB) []Span {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) > 0 {
		t.Fatalf("exports the receiver could not decode: %v", r.bad)
	}
	return append([]Span(nil), r.spans...)
}

// Wait waits (up to timeout) until flush, called between looks, has brought
// a span that match accepts, and returns the spans then received.
func (r *Receiver) Wait(t testing.TB, timeout time.Duration, flush func(), match func(Span) bool) []Span {
	t.Helper()
	var spans []Span
	waittest.Until(t, timeout, "the span to be exported", func() bool {
		flush()
		spans = r.Spans(t)
		for _, s := range spans {
			if match(s) {
				return true
			}
		}
		return false
	})
	return spans
}
