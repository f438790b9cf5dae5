package extproc

import (
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/tracing"
)

// startSpan begins the exchange's span, a child of the traceparent Envoy
// passed in the request headers (the client's, or Envoy's own span's).
func (x *exchange) startSpan() {
	p := x.s.opts.Tracing
	if !p.Enabled() {
		return
	}
	ctx := p.Propagator.Extract(x.ctx, propagation.MapCarrier(x.headers))
	path := x.headers[":path"]
	name := "ext_proc"
	if op := tracing.Operation(path); op != "" {
		name += " " + path
	}
	_, x.span = p.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(x.start),
		trace.WithAttributes(tracing.HTTPMethod.String(x.headers[":method"]), tracing.URLPath.String(path), tracing.RequestID.String(x.rid)))
}

// keepDecision says whether the exchange's pick is to be kept for its span.
func (x *exchange) keepDecision() bool { return x.span != nil && x.span.IsRecording() }

// traced records the pick on the span and returns the traceparent header to
// set on the request: the model server's span joins the trace under the
// pick's, unless Envoy's own tracing replaces it with its span's.
func (x *exchange) traced(rt *route.Route) []*corev3.HeaderValueOption {
	if x.span == nil {
		return nil
	}
	if x.span.IsRecording() {
		d := rt.Decision()
		x.span.SetAttributes(tracing.GenAIRequestModel.String(rt.Model()), tracing.Scheduler.String(rt.Scheduler()),
			tracing.Candidates.Int(d.Candidates), tracing.Winner.String(d.Winner), tracing.Score.Float64(d.Score), tracing.Scores.String(d.Scores))
	}
	carrier := propagation.MapCarrier{}
	x.s.opts.Tracing.Propagator.Inject(trace.ContextWithSpan(x.ctx, x.span), carrier)
	var set []*corev3.HeaderValueOption
	for k, v := range carrier {
		set = append(set, header(k, v))
	}
	return set
}

// finish ends the exchange's span and writes its access-log line, with the
// outcome the pick was finished with (nil: the request was never routed).
func (x *exchange) finish(o *route.Outcome) {
	if x.span == nil && x.s.opts.AccessLog == nil {
		return
	}
	e := tracing.Entry{RequestID: x.rid, Operation: tracing.Operation(x.headers[":path"]), Duration: time.Since(x.start)}
	if x.identity != nil {
		e.Tenant = x.identity.Tenant
	}
	if x.route != nil {
		e.Model, e.Scheduler, e.Endpoint = x.route.Model(), x.route.Scheduler(), x.route.Served()
	}
	e.Status = x.status // a refusal's, when it was never routed
	if o != nil {
		e.Status, e.InputTokens, e.OutputTokens = o.Status, o.PromptTokens, o.CompletionTokens
		e.Failed = o.StreamError || o.Status >= 500
	}
	if e.Status < 0 {
		e.Status = 0 // route.StatusUnseen: Envoy never showed the response
	}
	if x.span != nil {
		if x.span.IsRecording() {
			x.span.SetAttributes(tracing.HTTPStatus.Int(e.Status))
			if e.Endpoint != "" {
				x.span.SetAttributes(tracing.Endpoint.String(e.Endpoint))
			}
			if e.Tenant != "" {
				x.span.SetAttributes(tracing.Tenant.String(e.Tenant))
			}
			if o != nil && o.UsageSeen {
				x.span.SetAttributes(tracing.GenAIInputTokens.Int64(e.InputTokens), tracing.GenAIOutputTokens.Int64(e.OutputTokens))
			}
			if e.Failed {
				x.span.SetStatus(codes.Error, "the response failed")
			}
		}
		e.TraceID = x.span.SpanContext().TraceID().String()
		x.span.End()
	}
	x.s.opts.AccessLog.Log(x.ctx, &e)
}
