package gateway

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/schedule"
)

// This file is the gateway's routing core as other data planes use it: an Envoy
// ext_proc Endpoint Picker asks for a pick, learns later which endpoint Envoy
// really sent the request to, and reports the response's progress, so that the
// same pools, pickers, prefix index and fleet accounting serve both `kvgate serve`
// and `kvgate epp`.

// RouteRequest is what a pick needs.
type RouteRequest struct {
	RequestID string
	// Model is the requested model or adapter name.
	Model string
	// Prompt is the raw JSON head of the prompt (openai.Scan), for prefix
	// affinity; it may be nil.
	Prompt []byte
	// BodyBytes is the request body's size, or what is known of it, for the
	// fleet's estimate of the prompt's tokens.
	BodyBytes int64
	// Subset, when not nil, restricts the pick to these endpoint addresses; an
	// empty subset refuses the request (503), as the Endpoint Picker protocol asks.
	Subset []string
	// Start is when the request arrived (default: now).
	Start time.Time
	// Objective is the x-gateway-inference-objective header, whose priority
	// (spec.objectives) orders the requests waiting for an endpoint.
	Objective string
}

// Route is one request's pick, held from the decision to the end of the response.
// Its methods are safe for one goroutine; Finish releases what the pick reserved
// and must be called exactly once (later calls do nothing).
type Route struct {
	g     *Gateway
	p     *pool
	model string
	start time.Time
	// Endpoints are the ranked addresses: the first is reserved for the request,
	// the others are fallbacks for the data plane's retries.
	Endpoints []string

	served       *endpoint
	ticket       fleet.Ticket
	promptTokens int
	hashes       []uint64
	firstByte    bool
	finished     bool
	limit        int
}

// Scheduler is the name of the scheduler that picked.
func (r *Route) Scheduler() string { return r.p.name }

// Served is the endpoint the request is accounted to: the pick, or the one the
// data plane reported with Serve.
func (r *Route) Served() string { return r.served.addr }

// PromptLimit is how many bytes of a prompt's head the configuration's prefix
// indexes hash: a caller reading a body need not read further for the pick.
func (g *Gateway) PromptLimit() int {
	if rt := g.routes.Load(); rt != nil {
		return rt.promptLimit
	}
	return 0
}

// MaxBodyBytes is the configured request body limit (bbr.maxRequestBodyBytes).
func (g *Gateway) MaxBodyBytes() int64 {
	if rt := g.routes.Load(); rt != nil {
		return rt.maxBody
	}
	return 0
}

// Ready says whether the gateway can route: it has a configuration, is not
// draining, and knows at least one endpoint.
func (g *Gateway) Ready() bool {
	rt := g.routes.Load()
	if rt == nil || g.draining.Load() {
		return false
	}
	return slices.ContainsFunc(rt.pools, func(p *pool) bool { return len(p.endpoints) > 0 })
}

// BaseModel returns the base model of a model or adapter name the configuration
// routes (itself for a base model), and whether it routes it.
func (g *Gateway) BaseModel(name string) (string, bool) {
	if rt := g.routes.Load(); rt != nil {
		if p := rt.byModel[name]; p != nil {
			return p.spec.ModelName, true
		}
	}
	return "", false
}

// OnlyModel is the model of the configuration's only scheduler, for requests
// that name none, when there is exactly one.
func (g *Gateway) OnlyModel() (string, bool) {
	if rt := g.routes.Load(); rt != nil && len(rt.pools) == 1 {
		return rt.pools[0].spec.ModelName, true
	}
	return "", false
}

// CountRefused counts a request refused before it had a pool (a body that could
// not be read), as ServeHTTP's refusals are.
func (g *Gateway) CountRefused(status int) {
	g.count("", "", "", strconv.Itoa(status))
}

// Route picks an endpoint for a request and reserves it. The pick waits, up to
// the configured queue timeout, for an endpoint below its in-flight limit. A
// refusal is counted in the metrics as ServeHTTP counts it.
func (g *Gateway) Route(ctx context.Context, req RouteRequest) (*Route, *proxy.Refusal) {
	if req.Start.IsZero() {
		req.Start = time.Now()
	}
	rt := g.routes.Load()
	if rt == nil {
		g.CountRefused(http.StatusServiceUnavailable)
		return nil, &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Message: "the gateway has no configuration yet"}
	}
	p := rt.byModel[req.Model]
	if p == nil {
		g.CountRefused(http.StatusNotFound)
		return nil, &proxy.Refusal{Status: http.StatusNotFound, Type: openai.TypeNotFound, Message: noMatchingModel}
	}
	if t := p.spec.Timeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Start.Add(t))
		defer cancel()
	}
	sc := snapshotPool.Get().(*snapshotScratch)
	defer snapshotPool.Put(sc)
	hb := hashPool.Get().(*[]uint64)
	defer hashPool.Put(hb)
	limit := rt.gw.InFlightLimit()
	subset := req.Subset
	if subset != nil && len(subset) == 0 {
		g.m.Shed.WithLabelValues(p.name, "no_endpoint").Inc()
		g.count(p.name, req.Model, "", "503")
		return nil, &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeOverloaded, Message: "the proxy's subset hint lists no endpoint"}
	}
	d, code, msg := g.decide(ctx, decideArgs{rid: req.RequestID, p: p, model: req.Model, prompt: req.Prompt, subset: subset,
		limit: limit, wait: rt.gw.QueueWait(), start: req.Start, priority: rt.priorityOf(req.Objective)}, sc, hb)
	if code != 0 {
		g.count(p.name, req.Model, "", strconv.Itoa(code))
		return nil, &proxy.Refusal{Status: code, Type: openai.TypeOverloaded, Message: msg}
	}
	ranked := d.decision.Ranked
	if n := rt.gw.Attempts(); len(ranked) > n {
		ranked = ranked[:n]
	}
	r := &Route{g: g, p: p, model: req.Model, start: req.Start, served: d.first, limit: limit,
		promptTokens: int(req.BodyBytes / 4), Endpoints: make([]string, 0, len(ranked))}
	// The reserved endpoint leads even if another ranked higher but was full.
	r.Endpoints = append(r.Endpoints, d.first.addr)
	for _, c := range ranked {
		if c.Address != d.first.addr {
			r.Endpoints = append(r.Endpoints, c.Address)
		}
	}
	if len(d.hashes) > 0 {
		var capacity int
		if i := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == d.first.addr }); i >= 0 {
			capacity = p.prefix.capacityOf(d.cands[i].Metrics)
		} else {
			capacity = p.prefix.capacity
		}
		g.prefix.Record(d.first.addr, d.hashes, capacity)
		if len(r.Endpoints) > 1 {
			r.hashes = slices.Clone(d.hashes) // for a fallback the data plane may use
		}
	}
	r.ticket = g.fleet.Dispatched(d.first.addr, r.promptTokens)
	return r, nil
}

// Serve moves the request's accounting to the endpoint the data plane reports it
// used, when that is not the pick (a fallback after a failed attempt). An
// address outside the pool is ignored.
func (r *Route) Serve(addr string) {
	if r.finished || addr == "" || addr == r.served.addr {
		return
	}
	ep := r.p.endpoint(addr)
	if ep == nil {
		return
	}
	r.release()
	r.g.m.Retries.WithLabelValues(r.p.name, "fallback").Inc()
	// The data plane already sent it there: the slot is taken whatever the limit.
	ep.tryAcquire(0)
	r.served = ep
	r.ticket = r.g.fleet.Dispatched(addr, r.promptTokens)
	if len(r.hashes) > 0 {
		capacity := r.p.prefix.capacity
		if s := r.g.fleet.Snapshot([]string{addr}); s[0].Scraped {
			capacity = r.p.prefix.capacityOf(s[0].Metrics)
		}
		r.g.prefix.Record(addr, r.hashes, capacity)
	}
}

// FirstByte records the first byte of the response body: the prefill is done.
// streamed says the response is a stream of events (its first byte is the
// first token's).
func (r *Route) FirstByte(streamed bool) {
	if r.firstByte || r.finished {
		return
	}
	r.firstByte = true
	r.g.fleet.FirstToken(r.ticket)
	r.g.observeTTFT(r.p.name, time.Since(r.start), streamed)
}

// Statuses of Outcome beyond HTTP's, counted in kvgate_requests_total's code
// label as "incomplete" and "unseen".
const (
	// StatusIncomplete: the response started and ended early (the client went
	// away or the upstream broke).
	StatusIncomplete = -1
	// StatusUnseen: the data plane never showed the response.
	StatusUnseen = -2
)

// Outcome is how a routed request ended.
type Outcome struct {
	// Status is the HTTP status the endpoint answered, or StatusIncomplete or
	// StatusUnseen; 0 counts as 499: the request ended before a response (the
	// client went away).
	Status int
	// Unanswered says the request was refused after the pick, before the
	// endpoint answered (a body over the limit): it is not counted against the
	// endpoint.
	Unanswered bool
	// StreamError says the response broke after bytes reached the client.
	StreamError bool
	// Usage, when Seen, is the token usage the endpoint reported.
	PromptTokens, CompletionTokens int64
	UsageSeen                      bool
}

// Finish ends the request: it counts it and releases its endpoint.
func (r *Route) Finish(o Outcome) {
	if r.finished {
		return
	}
	m := r.g.m
	if o.StreamError {
		m.StreamErrors.WithLabelValues(r.p.name).Inc()
	}
	if o.UsageSeen {
		m.Tokens.WithLabelValues(r.p.name, "prompt").Add(float64(o.PromptTokens))
		m.Tokens.WithLabelValues(r.p.name, "completion").Add(float64(o.CompletionTokens))
	}
	code := "499"
	switch {
	case o.Status > 0:
		code = strconv.Itoa(o.Status)
	case o.Status == StatusIncomplete:
		code = "incomplete"
	case o.Status == StatusUnseen:
		code = "unseen"
	}
	endpoint := r.served.addr
	if o.Unanswered {
		endpoint = ""
	}
	r.g.count(r.p.name, r.model, endpoint, code)
	r.g.observeDuration(r.p.name, code, time.Since(r.start))
	r.release()
	r.finished = true
}

func (r *Route) release() {
	r.served.release()
	r.g.fleet.Completed(r.ticket)
	r.g.freed.signal()
}

// UsageReader finds the token usage in a response as it streams past: the usage
// object of a JSON body, or of the server-sent event that carries it.
type UsageReader struct{ o usageObserver }

// NewUsageReader reads a server-sent event stream when sse is true, else a JSON
// body.
func NewUsageReader(sse bool) *UsageReader { return &UsageReader{o: usageObserver{sse: sse}} }

// Feed passes the next bytes of the response.
func (u *UsageReader) Feed(p []byte) { u.o.feed(p) }

// Events counts the server-sent events with data fed so far, but [DONE]: about
// one token each, for a stream without usage.
func (u *UsageReader) Events() int64 { return u.o.events }

// Usage returns the usage found, once the whole response was fed.
func (u *UsageReader) Usage() (prompt, completion int64, ok bool) {
	u.o.finish()
	return u.o.prompt, u.o.output, u.o.seen
}
