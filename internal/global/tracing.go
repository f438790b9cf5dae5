package global

import (
	"context"
	"errors"
	"net/http"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/tracing"
)

// traceOf is the request's trace, or nil: without traces or the access log
// the hot path does not look it up in the context.
func (r *Router) traceOf(ctx context.Context) *tracing.Request {
	if !r.opts.Tracing.Enabled() && r.opts.AccessLog == nil {
		return nil
	}
	return tracing.From(ctx)
}

// ranked records the members the request may go to, best first.
func ranked(tr *tracing.Request, model, tenant string, candidates int, first string) {
	if tr == nil {
		return
	}
	tr.Entry.Model, tr.Entry.Tenant = model, tenant
	if first != "" {
		tr.Decision(candidates, first, 0, "")
	}
}

// attempting is the proxy's OnAttempt: a span per member tried, its
// traceparent sent to the member, whose own request span joins the trace
// under it. nil when the request is not traced.
func attempting(tr *tracing.Request, targets []proxy.Target) func(int, *http.Request) {
	if !tr.Tracing() {
		return nil
	}
	return func(k int, out *http.Request) { tr.Attempt(k, out, targets[k].Name) }
}

// failedReason labels why a member was given up on, as tier 1 labels its
// retries.
func failedReason(err *proxy.AttemptError) string {
	switch {
	case err.Status != 0:
		return "status"
	case errors.Is(err, proxy.ErrTimeout): // routing.firstByteTimeout's too
		return "timeout"
	}
	return "connect"
}

// served records how the proxy ended.
func served(tr *tracing.Request, targets []proxy.Target, res *proxy.Result) {
	if tr == nil {
		return
	}
	if res.Target >= 0 && res.Committed {
		tr.Entry.Endpoint = targets[res.Target].Name
	}
	if res.Usage.Seen {
		tr.Entry.InputTokens, tr.Entry.OutputTokens = res.Usage.Prompt, res.Usage.Completion
	}
	tr.Forwarded(res.Target, res.Status, res.Code)
}
