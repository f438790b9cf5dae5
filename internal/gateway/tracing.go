package gateway

import (
	"context"
	"net/http"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/tracing"
)

// traceOf is the request's trace, or nil: without traces or the access log
// the hot path does not look it up in the context.
func (g *Gateway) traceOf(ctx context.Context) *tracing.Request {
	if !g.opts.Tracing.Enabled() && g.opts.AccessLog == nil {
		return nil
	}
	return tracing.From(ctx)
}

// routing notes what the request asks for before the pick, and says whether
// the pick is to be kept for the span (route.Request.Trace).
func routing(tr *tracing.Request, model string, id *auth.Identity) bool {
	if tr == nil {
		return false
	}
	tr.Entry.Model = model
	if id != nil {
		tr.Entry.Tenant = id.Tenant
	}
	return tr.Recording()
}

// routed records the pick.
func routed(tr *tracing.Request, rt *route.Route) {
	if tr == nil {
		return
	}
	tr.Entry.Scheduler = rt.Scheduler()
	d := rt.Decision()
	tr.Decision(d.Candidates, d.Winner, d.Score, d.Scores)
}

// attempting is the proxy's OnAttempt: a span per attempt, its traceparent
// sent to the model server. nil when the request is not traced.
func attempting(tr *tracing.Request, targets []proxy.Target) func(int, *http.Request) {
	if !tr.Tracing() {
		return nil
	}
	return func(i int, out *http.Request) { tr.Attempt(i, out, targets[i].Name) }
}

// forwarded records how the proxy ended: the endpoint accounted, the usage,
// and the attempts' ends.
func forwarded(tr *tracing.Request, rt *route.Route, res *proxy.Result) {
	if tr == nil {
		return
	}
	tr.Entry.Endpoint = rt.Served()
	if res.Usage.Seen {
		tr.Entry.InputTokens, tr.Entry.OutputTokens = res.Usage.Prompt, res.Usage.Completion
	}
	tr.Forwarded(res.Target, res.Status, res.Code)
}
