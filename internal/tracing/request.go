package tracing

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Request follows one client request through a data plane: its span (a
// child of the client's traceparent, if any), a child span per upstream
// attempt, and its access-log line. Its methods are for the request's own
// goroutine; on a nil *Request they do nothing, so that a data plane with
// neither traces nor the access log pays for one comparison.
type Request struct {
	p    *Provider
	log  *AccessLog
	ctx  context.Context // holds span
	span trace.Span
	// name is the attempts' span name, the request span's.
	name     string
	attempts []trace.Span
	start    time.Time
	// Entry is what the data plane learnt of the request, for the span's
	// attributes and the access log; the data plane fills it in.
	Entry Entry
}

type requestKey struct{}

// Start begins following r, which arrived at start with request id rid. It
// returns nil and r when p (nil: disabled) records nothing and log is nil;
// else r with a context that carries the span and the Request (From).
func Start(p *Provider, log *AccessLog, r *http.Request, start time.Time, rid string) (*Request, *http.Request) {
	recording := p != nil && p.Enabled()
	if !recording && log == nil {
		return nil, r
	}
	t := &Request{p: p, log: log, start: start, name: r.Method, Entry: Entry{RequestID: rid, Operation: Operation(r.URL.Path)}}
	if t.Entry.Operation != "" {
		// The API's paths are few: the span name stays low in cardinality.
		t.name = r.Method + " " + r.URL.Path
	}
	ctx := r.Context()
	if recording {
		ctx = p.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
		ctx, t.span = p.Tracer.Start(ctx, t.name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start),
			trace.WithAttributes(HTTPMethod.String(r.Method), URLPath.String(r.URL.Path), RequestID.String(rid)))
	}
	t.ctx = context.WithValue(ctx, requestKey{}, t)
	return t, r.WithContext(t.ctx)
}

// From returns the Request ctx carries, or nil.
func From(ctx context.Context) *Request {
	t, _ := ctx.Value(requestKey{}).(*Request)
	return t
}

// Recording says whether the request's span is recorded: worth rendering the
// routing decision for.
func (t *Request) Recording() bool { return t != nil && t.span != nil && t.span.IsRecording() }

// Tracing says whether attempts get spans (and a traceparent).
func (t *Request) Tracing() bool { return t != nil && t.span != nil }

// Decision records the pick: how many candidates the picker weighed, the
// winner, its score and every ranked candidate's.
func (t *Request) Decision(candidates int, winner string, score float64, scores string) {
	if !t.Recording() {
		return
	}
	t.span.SetAttributes(Candidates.Int(candidates), Winner.String(winner))
	if scores != "" {
		// Tier 2 ranks members without scores.
		t.span.SetAttributes(Score.Float64(score), Scores.String(scores))
	}
}

// Attempt starts attempt i's span, a child of the request's, at endpoint
// (an address, or a URL's host for tier 2), and writes its traceparent into
// out's headers, over any the client sent: the model server's spans join the
// trace under the attempt.
func (t *Request) Attempt(i int, out *http.Request, endpoint string) {
	if !t.Tracing() {
		return
	}
	attrs := []attribute.KeyValue{HTTPMethod.String(out.Method), Endpoint.String(endpoint), Attempt.Int(i)}
	if host, port, err := net.SplitHostPort(out.URL.Host); err == nil {
		attrs = append(attrs, ServerAddress.String(host))
		if n, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, ServerPort.Int(n))
		}
	}
	if i > 0 {
		attrs = append(attrs, HTTPResendCount.Int(i))
	}
	ctx, s := t.p.Tracer.Start(t.ctx, t.name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	for len(t.attempts) <= i {
		t.attempts = append(t.attempts, nil)
	}
	t.attempts[i] = s
	t.p.Propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
}

// Failed ends attempt i, given up on for the next: the status it answered
// (0: none), and reason, the retry's label (status, connect, timeout, ...).
// why is the failure's text: operators' data, never the client's.
func (t *Request) Failed(i, status int, reason string, why error) {
	if t == nil {
		return
	}
	t.Entry.Retries++
	if t.span != nil {
		t.span.SetAttributes(RetryReason.String(reason))
	}
	s := t.attempt(i)
	if s == nil {
		return
	}
	if status != 0 {
		s.SetAttributes(HTTPStatus.Int(status))
	}
	desc := reason
	if why != nil {
		desc = why.Error()
	}
	s.SetAttributes(ErrorType.String(reason), RetryReason.String(reason))
	s.SetStatus(codes.Error, desc)
	s.End()
	t.attempts[i] = nil
}

// FirstByte marks the answer's first bytes, from attempt i.
func (t *Request) FirstByte(i int) {
	if t == nil {
		return
	}
	now := time.Now()
	t.Entry.TTFT = now.Sub(t.start)
	if s := t.attempt(i); s != nil {
		s.AddEvent(EventFirstToken, trace.WithTimestamp(now))
	}
}

// Forwarded ends the attempts still open once the proxy is done: target i
// (-1: none) answered status, and the answer ended as code (a proxy Code);
// the others were cut short (the client gone, the deadline).
func (t *Request) Forwarded(i, status int, code string) {
	if t == nil {
		return
	}
	if code == "stream_error" {
		t.Entry.Failed = true
	}
	for k, s := range t.attempts {
		if s == nil {
			continue
		}
		switch {
		case k != i || status == 0:
			s.SetAttributes(ErrorType.String("cancelled"))
			s.SetStatus(codes.Error, "cancelled before an answer")
		default:
			s.SetAttributes(HTTPStatus.Int(status))
			if status >= 500 || code == "stream_error" {
				s.SetAttributes(ErrorType.String(errorType(status, code)))
				s.SetStatus(codes.Error, errorType(status, code))
			}
		}
		s.End()
	}
	t.attempts = t.attempts[:0]
}

func (t *Request) attempt(i int) trace.Span {
	if i < 0 || i >= len(t.attempts) {
		return nil
	}
	return t.attempts[i]
}

// TraceID is the request's trace id, "" when untraced.
func (t *Request) TraceID() string {
	if !t.Tracing() {
		return ""
	}
	return t.span.SpanContext().TraceID().String()
}

// End ends the request, answered with status (0: nothing was written, the
// client went away), and writes its access-log line.
func (t *Request) End(status int) {
	if t == nil {
		return
	}
	t.Forwarded(-1, 0, "")
	if status == 0 {
		status = 499 // nginx's client closed request, as the metrics count it
	}
	e := &t.Entry
	e.Status = status
	e.Failed = e.Failed || status >= 500
	e.Duration = time.Since(t.start)
	if t.span != nil {
		if t.span.IsRecording() {
			attrs := []attribute.KeyValue{HTTPStatus.Int(status), Retries.Int(e.Retries)}
			if e.Operation != "" {
				attrs = append(attrs, GenAIOperation.String(e.Operation))
			}
			if e.Model != "" {
				attrs = append(attrs, GenAIRequestModel.String(e.Model))
			}
			if e.Scheduler != "" {
				attrs = append(attrs, Scheduler.String(e.Scheduler))
			}
			if e.Endpoint != "" {
				attrs = append(attrs, Endpoint.String(e.Endpoint))
			}
			if e.Tenant != "" {
				attrs = append(attrs, Tenant.String(e.Tenant))
			}
			if e.TTFT > 0 {
				attrs = append(attrs, GenAITTFT.Float64(e.TTFT.Seconds()))
			}
			if e.InputTokens > 0 || e.OutputTokens > 0 {
				attrs = append(attrs, GenAIInputTokens.Int64(e.InputTokens), GenAIOutputTokens.Int64(e.OutputTokens))
			}
			t.span.SetAttributes(attrs...)
			if e.Failed {
				et := strconv.Itoa(status)
				if status < 500 {
					et = "stream_error" // the headers went out fine, the body broke
				}
				t.span.SetAttributes(ErrorType.String(et))
				t.span.SetStatus(codes.Error, et)
			}
		}
		e.TraceID = t.span.SpanContext().TraceID().String()
		t.span.End()
	}
	t.log.Log(t.ctx, e)
}

// errorType is error.type for an answer: its status, or how it broke.
func errorType(status int, code string) string {
	if code == "stream_error" {
		return code
	}
	return strconv.Itoa(status)
}

// Wrap returns w, recording the status written (Status); nil t returns w.
func (t *Request) Wrap(w http.ResponseWriter) http.ResponseWriter {
	if t == nil {
		return w
	}
	return &StatusWriter{ResponseWriter: w}
}

// StatusWriter records the status of the response written through it.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

// WriteHeader records the first final status.
func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 && code >= 200 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WrittenStatus is the status written to w if it is a StatusWriter, else 0.
func WrittenStatus(w http.ResponseWriter) int {
	if s, ok := w.(*StatusWriter); ok {
		return s.Status
	}
	return 0
}
