package route

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/schedule"
)

// This file is the routing core as a front calls it: Route for a pick, then,
// as the response goes, Retry (a front trying the next endpoint itself) or
// Serve (a data plane reporting where it sent the request, as Envoy does),
// Sent, FirstByte and Finish.

// Request is what a pick needs.
type Request struct {
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
	// Explain keeps every candidate's scores in the Route (Scores).
	Explain bool
	// Header returns a request header's value, for a scheduler's session
	// key (sessionAffinity.header); nil reads none.
	Header func(name string) string
	// User is the body's "user" field, for a scheduler that takes session
	// keys from it (WantsUser).
	User string
	// Identity is who sent the request (Authenticate); nil without spec.auth.
	Identity *auth.Identity
	// Trace keeps the decision for the request's span (Route.Decision).
	Trace bool
	// BodyPending says the body was still coming from the client when the
	// request was picked (a front that streams it on): until Sent, the
	// endpoint has none of its prefill to do, and its work is not counted
	// ahead of other requests there.
	BodyPending bool
}

// Route is one request's pick, held from the decision to the end of the response.
// Its methods are safe for one goroutine; Finish releases what the pick reserved
// and must be called exactly once (later calls do nothing).
type Route struct {
	g     *Router
	p     *scheduler
	model string
	start time.Time
	// Endpoints are the ranked addresses: the first is reserved for the request,
	// the others are fallbacks for the data plane's retries.
	Endpoints []string
	// Scores renders the candidates' scores, when the request asked (Explain)
	// and may read them (Expose).
	Scores string
	// Expose says whether the client may read routing internals, such as the
	// address of the endpoint that served (spec.gateway.diagnostics).
	Expose bool
	// RetryBuffer is how much of a request body may be kept to send it again
	// to a fallback (spec.gateway.retryBufferBytes).
	RetryBuffer int64
	// usableAtPick says, per entry of Endpoints, whether the fleet read it as
	// healthy and fresh when the request was picked.
	usableAtPick []bool
	// FirstByteTimeout, StreamIdleTimeout and ClientWriteTimeout are the
	// configuration's bounds on the response (spec.gateway).
	FirstByteTimeout, StreamIdleTimeout, ClientWriteTimeout time.Duration

	served       *endpoint
	ticket       fleet.Ticket
	promptTokens int
	hashes       []uint64
	firstByte    bool
	finished     bool
	limit        slots
	session      string
	// probe says the endpoint was probed (probe.go): its answer may show
	// its learned speed wrong.
	probe bool
	// What the served endpoint's speed is learned from: when the request's
	// last byte went there (Sent), the prefill work ahead of it with its
	// own, the batch it joined, and when its first byte came. sentAt, ticket
	// and dispatched are guarded by mu: Sent may run on the transport's
	// goroutine while the front reads the answer.
	mu              sync.Mutex
	sentAt, firstAt time.Time
	dispatched      bool // the fleet counts the request (ticket)
	// recordCap, when not 0, is the prefix capacity to record the prompt's
	// blocks at the served endpoint with once the body is all sent.
	recordCap      int
	ahead, running float64
	loads          float64 // 1: the adapter was not loaded there
	own            int     // the prompt tokens not expected to be cached
	decision       Decision
}

// Scheduler is the name of the scheduler that picked.
func (r *Route) Scheduler() string { return r.p.name }

// Served is the endpoint the request is accounted to: the pick, or the one the
// data plane reported with Serve.
func (r *Route) Served() string { return r.served.addr }

// Ready says whether the router can route: it has a configuration, is not
// draining, and every scheduler has a ready endpoint.
func (g *Router) Ready() bool {
	return g.routes.Load() != nil && !g.draining.Load() && len(g.Unready()) == 0
}

// Unready lists the schedulers with no endpoint the fleet reads as healthy and
// fresh: requests for their models would fail or wait.
func (g *Router) Unready() []string {
	rt := g.routes.Load()
	if rt == nil {
		return nil
	}
	var out []string
	for _, p := range rt.schedulers {
		addrs := make([]string, len(p.endpoints))
		for i, e := range p.endpoints {
			addrs[i] = e.addr
		}
		if !slices.ContainsFunc(g.fleet.Snapshot(addrs), func(s fleet.Snapshot) bool { return s.Healthy && !s.Stale }) {
			out = append(out, p.name)
		}
	}
	return out
}

// CountRefused counts a request refused before it had a scheduler (a body that could
// not be read), as ServeHTTP's refusals are.
func (g *Router) CountRefused(status int) {
	g.count("", "", "", strconv.Itoa(status))
}

// Route picks an endpoint for a request and reserves it. The pick waits, up to
// the configured queue timeout, for an endpoint below its in-flight limit. A
// refusal is counted in the metrics as ServeHTTP counts it.
func (g *Router) Route(ctx context.Context, req Request) (*Route, *proxy.Refusal) {
	return g.route(ctx, g.routes.Load(), req)
}

// route is Route under the configuration rt.
func (g *Router) route(ctx context.Context, rt *routes, req Request) (*Route, *proxy.Refusal) {
	if req.Start.IsZero() {
		req.Start = g.now()
	}
	if rt == nil {
		g.CountRefused(http.StatusServiceUnavailable)
		return nil, proxy.NoConfiguration()
	}
	p := rt.byModel[req.Model]
	if p == nil {
		g.CountRefused(http.StatusNotFound)
		return nil, proxy.UnknownModel()
	}
	if !allowed(p, req.Identity) {
		// Counted as the unknown model it looks like; the log says why.
		g.log.Debug("tenant not allowed on the scheduler", "request_id", req.RequestID, "scheduler", p.name, "tenant", req.Identity.Tenant)
		g.CountRefused(http.StatusNotFound)
		return nil, notAllowed()
	}
	if t := p.spec.Timeout(); t > 0 {
		var cancel context.CancelFunc
		// What is left of it on the router's clock, timed by the wall's: the
		// two differ in virtual time.
		ctx, cancel = context.WithTimeout(ctx, t-g.now().Sub(req.Start))
		defer cancel()
	}
	sc := snapshotPool.Get().(*snapshotScratch)
	defer snapshotPool.Put(sc)
	hb := hashPool.Get().(*[]uint64)
	defer hashPool.Put(hb)
	limit := g.slots(rt.gw.InFlightLimit())
	subset := req.Subset
	if subset != nil && len(subset) == 0 {
		g.count(p.name, req.Model, "", "503")
		return nil, g.shed(p, "no_endpoint", http.StatusServiceUnavailable, "the proxy's subset hint lists no endpoint")
	}
	session := ""
	switch {
	case p.sessions == nil:
	case p.spec.SessionFromUser():
		session = req.User
	case req.Header != nil:
		session = req.Header(p.spec.SessionHeader())
	}
	slo := p.spec.SLO()
	if o, ok := rt.sloOf[req.Objective]; ok {
		slo = o
	}
	d, ref := g.decide(ctx, decideArgs{rid: req.RequestID, p: p, model: req.Model, prompt: req.Prompt, subset: subset,
		limit: limit, wait: rt.gw.QueueWait(), start: req.Start, priority: rt.priorityOf(req.Objective),
		promptTokens: int(req.BodyBytes / 4), slo: slo, session: session}, sc, hb)
	if ref != nil {
		g.count(p.name, req.Model, "", strconv.Itoa(ref.Status))
		return nil, ref
	}
	ranked := d.decision.Ranked
	r := &Route{g: g, p: p, model: req.Model, start: req.Start, served: d.first, limit: limit,
		promptTokens: int(req.BodyBytes / 4), Endpoints: make([]string, 0, len(ranked)+1), RetryBuffer: rt.gw.RetryBuffer(),
		FirstByteTimeout: rt.gw.FirstByte(), StreamIdleTimeout: rt.gw.StreamIdle(), ClientWriteTimeout: rt.gw.ClientWrite(),
		Expose: exposes(rt.gw, req.Identity)}
	// The dispatch is counted before anything else: until it is, concurrent
	// picks see the endpoint as it was and herd onto it.
	r.own = r.promptTokens
	if i := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == d.first.addr }); i >= 0 {
		c := &d.cands[i]
		r.own = int(float64(r.promptTokens) * (1 - min(max(c.PrefixMatch, 0), 1)))
		r.ahead = schedule.WorkAhead(c)
		r.running = c.Running
		r.loads = schedule.AdapterLoads(schedule.Request{Adapter: adapterOf(p, req.Model)}, c)
	}
	d.first.adapters.sent(adapterOf(p, req.Model))
	if !req.BodyPending {
		r.dispatch()
	}
	// Else counted once its body is all there (Sent): an upload that takes a
	// minute is no work ahead of others at the endpoint meanwhile, and
	// counting it would send them elsewhere for that minute.
	if req.Trace {
		r.decision = traced(d)
	}
	if req.Explain && r.Expose {
		r.Scores = explain(d.decision)
		now := g.now()
		for _, e := range p.endpoints {
			if e.ejected(now) {
				r.Scores += "; ejected " + e.addr // read as unhealthy: passed over while others remain
			}
		}
	}
	// The reserved endpoint leads even if another ranked higher but was full.
	r.Endpoints = append(r.Endpoints, d.first.addr)
	for _, c := range ranked {
		if c.Address != d.first.addr {
			r.Endpoints = append(r.Endpoints, c.Address)
		}
	}
	// Past the ranked ones, the endpoints the picker filtered out (saturated,
	// stale, unhealthy: in that order at the back of the candidates) are the
	// last fallbacks: a busy endpoint's answer beats relaying a failure.
	n := rt.gw.Attempts()
	for _, c := range d.cands {
		if len(r.Endpoints) >= n {
			break
		}
		if !slices.Contains(r.Endpoints, c.Address) {
			r.Endpoints = append(r.Endpoints, c.Address)
		}
	}
	// maxAttempts counts the reserved endpoint, wherever it ranked.
	if len(r.Endpoints) > n {
		r.Endpoints = r.Endpoints[:n]
	}
	r.usableAtPick = make([]bool, len(r.Endpoints))
	for i, addr := range r.Endpoints {
		if k := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == addr }); k >= 0 {
			r.usableAtPick[i] = d.cands[k].Healthy && !d.cands[k].Stale
		}
	}
	if len(d.hashes) > 0 {
		var capacity int
		if i := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == d.first.addr }); i >= 0 {
			capacity = p.prefix.capacityOf(d.cands[i].Metrics)
		} else {
			capacity = p.prefix.capacity
		}
		if r.dispatched {
			g.record(d.first.addr, d.hashes, capacity)
		} else {
			// Recorded once the body is all sent (Sent): an upload given
			// up midway leaves no prompt in the engine's cache, and a
			// belief that it did would make the next answer there look
			// slow for the prefill it then computes.
			r.recordCap = capacity
		}
		if len(r.Endpoints) > 1 || !r.dispatched {
			r.hashes = slices.Clone(d.hashes) // for a fallback the data plane may use, or Sent
		}
	}
	r.session, r.probe = session, d.probe
	if p.sessions != nil {
		p.sessions.put(session, d.first.addr, g.now())
	}
	return r, nil
}

// dispatch counts the request at the served endpoint in the fleet's
// accounting; r.mu is held, or the Route is not shared yet.
func (r *Route) dispatch() {
	r.ticket = r.g.fleet.Dispatched(r.served.addr, r.promptTokens, r.own)
	r.dispatched = true
	r.g.touch()
}

// Sent records that the request's last byte was written to addr, the endpoint
// it is served by: the endpoint has all of it now, and its time to first
// token, which teaches its speed, is timed from here — not from the pick,
// which a slow client or a slow network before the gateway would make late
// by the time the body took to arrive. A request never Sent teaches nothing.
// kvgate serve calls it as the write completes (httptrace's WroteRequest),
// the Envoy front as the body's end goes back to the data plane, the
// virtual-time bench as it dispatches. It is safe to call concurrently with
// FirstByte, but not once the attempt at addr is over (Retry, Serve,
// Finish). Later calls, and calls for another address, do nothing.
func (r *Route) Sent(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished || r.firstByte || addr != r.served.addr || !r.sentAt.IsZero() {
		return
	}
	r.sentAt = r.g.now()
	if !r.dispatched {
		r.dispatch()
	}
	if r.recordCap > 0 {
		r.g.record(addr, r.hashes, r.recordCap)
		r.recordCap = 0
	}
}

// adapterOf is the adapter a model name asks p for, "" for its base model.
func adapterOf(p *scheduler, model string) string {
	if model == p.spec.ModelName {
		return ""
	}
	return model
}

// Serve moves the request's accounting to the endpoint the data plane reports it
// used, when that is not the pick (a fallback after a failed attempt). The data
// plane already sent it there, so the slot is taken whatever the limit. An
// address outside the scheduler is ignored.
func (r *Route) Serve(addr string) {
	if r.move(addr, slots{}) {
		r.g.m.Retries.WithLabelValues(r.p.name, "fallback").Inc()
		// The data plane reports it when the answer began: when the request
		// went there and what was ahead of it then are not known, so its
		// answer teaches the endpoint's speed nothing.
		r.mu.Lock()
		r.sentAt = time.Time{}
		r.mu.Unlock()
	}
}

// Retry moves the request to the next endpoint a front is about to try, if that
// endpoint has a free slot; it reports whether it did.
func (r *Route) Retry(addr string) bool { return r.move(addr, r.limit) }

// move releases the served endpoint and reserves addr's slot, if limit has room (zero:
// any), with its fleet ticket and prefix record.
func (r *Route) move(addr string, limit slots) bool {
	if r.finished || addr == "" || addr == r.served.addr {
		return false
	}
	ep := r.p.endpoint(addr)
	if ep == nil || !ep.tryAcquire(limit) {
		return false
	}
	r.release()
	r.served = ep
	// Its speed is learned against what was ahead of it there.
	s := r.g.fleet.Snapshot([]string{addr})[0]
	there := schedule.Endpoint{Address: addr, Signals: schedule.Signals{Metrics: s.Metrics, PrefillWork: float64(s.PrefillWork),
		Speed: ep.speed.Speed(r.p.poolSpeed())}}
	r.own = r.promptTokens // what it holds of the prompt there is not known
	r.ahead, r.running = schedule.WorkAhead(&there), s.Running
	r.loads = schedule.AdapterLoads(schedule.Request{Adapter: adapterOf(r.p, r.model)}, &there)
	if r.p.sessions != nil {
		r.p.sessions.put(r.session, addr, r.g.now())
	}
	ep.adapters.sent(adapterOf(r.p, r.model))
	// A fallback gets the body from the gateway's buffer, whole: counted at
	// once, and timed from its own Sent.
	r.mu.Lock()
	r.sentAt, r.recordCap = time.Time{}, 0 // recorded here, below
	r.dispatch()
	r.mu.Unlock()
	if len(r.hashes) > 0 {
		capacity := r.p.prefix.capacity
		if s.Scraped {
			capacity = r.p.prefix.capacityOf(s.Metrics)
		}
		r.g.record(addr, r.hashes, capacity)
	}
	return true
}

// Failed records that addr failed an attempt the front then gave up on (a
// connection failure, a 5xx, a first-byte timeout), for outlier detection.
func (r *Route) Failed(addr string) {
	if ep := r.p.endpoint(addr); ep != nil {
		r.g.answered(r.p, ep, true)
	}
}

// Deadline is when the scheduler's routeTimeout ends the request, if it has one.
func (r *Route) Deadline() (time.Time, bool) {
	if t := r.p.spec.Timeout(); t > 0 {
		return r.start.Add(t), true
	}
	return time.Time{}, false
}

// Lost says whether Endpoints[i], read as healthy and fresh when the request
// was picked, no longer is: it froze or went away, and a request waiting on it
// is better tried elsewhere. An endpoint not usable at the pick (never scraped,
// or picked because nothing was healthy) is never lost.
func (r *Route) Lost(i int) bool {
	if i >= len(r.usableAtPick) || !r.usableAtPick[i] {
		return false
	}
	s := r.g.fleet.Snapshot(r.Endpoints[i : i+1])[0]
	return !s.Healthy || s.Stale
}

// Transport is the scheduler's upstream transport.
func (r *Route) Transport() http.RoundTripper { return r.p.transport }

// Model is the model or adapter the request named.
func (r *Route) Model() string { return r.model }

// FirstByte records the first byte of the response body: the prefill is done.
// status is the response's; streamed says it is a stream of events (its first
// byte is the first token's).
func (r *Route) FirstByte(status int, streamed bool) {
	if r.firstByte || r.finished {
		return
	}
	now := r.g.now()
	r.mu.Lock()
	r.firstByte = true // under mu: a Sent after it counts nothing
	sentAt, dispatched, ticket := r.sentAt, r.dispatched, r.ticket
	r.mu.Unlock()
	if dispatched {
		r.g.fleet.FirstToken(ticket)
		r.g.touch()
	}
	r.g.observeTTFT(r.p.name, now.Sub(r.start), streamed)
	if streamed {
		r.served.ttftMinute(now, now.Sub(r.start))
	}
	// A whole answer's first byte says nothing of its first token, nor does
	// a refusal's (an error status comes before any prefill, or instead of
	// it): only a stream the endpoint accepted, timed from when it had all
	// of the request, is what the endpoint did.
	if streamed && status >= 200 && status < 300 && !sentAt.IsZero() {
		r.firstAt = now
		ttft := now.Sub(sentAt).Seconds()
		r.served.taught(now, r.probe, r.probe && r.relearn(ttft))
		r.served.speed.ObserveTTFT(float64(r.own), r.ahead, r.running, r.loads, ttft, r.p.poolSpeed())
		r.g.answeredSpeed(peers.Answer{Endpoint: r.served.addr, Own: float64(r.own), Ahead: r.ahead, Running: r.running, Loads: r.loads, Seconds: ttft})
		r.p.observedAt.Store(now.UnixNano())
		r.p.refreshPrior(now)
	}
}

// StatusUnseen is an Outcome's status when the data plane never showed the
// response; it is counted as code "unseen".
const StatusUnseen = -1

// Outcome is how a routed request ended.
type Outcome struct {
	// Status is the HTTP status the endpoint answered, or StatusUnseen; 0 counts
	// as 499: the request ended before a response (the client went away).
	Status int
	// Unanswered says the request was refused after the pick, before the
	// endpoint answered (a body over the limit): it is not counted against the
	// endpoint.
	Unanswered bool
	// StreamError says the response broke after it started: counted as code
	// "stream_error" whatever its status, and as a failure in the load summary.
	StreamError bool
	// ClientGone says the client went away while the response streamed (code 499).
	ClientGone bool
	// EndpointsFailed says every endpoint tried failed before answering: the
	// refusal (Status) is theirs, counted as a failure in the load summary, not
	// as admission shedding.
	EndpointsFailed bool
	// Usage, when Seen, is the token usage the endpoint reported.
	PromptTokens, CompletionTokens int64
	UsageSeen                      bool
}

// failedAnswer says whether an endpoint's answer counts against it for
// routing: a 5xx, a broken stream, or a 429 (it is overloaded: sending it more
// only earns more refusals while others have room).
func failedAnswer(o Outcome) bool {
	return o.StreamError || o.Status >= 500 || o.Status == http.StatusTooManyRequests
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
	code := proxy.CodeClientGone
	switch {
	case o.ClientGone:
	case o.StreamError:
		code = proxy.CodeStreamError
	case o.Status > 0:
		code = proxy.Code(o.Status)
	case o.Status == StatusUnseen:
		code = proxy.CodeUnseen
	}
	endpoint := r.served.addr
	if o.Unanswered {
		endpoint = ""
	}
	// The endpoint's answer, as outlier detection judges it; a client that
	// left says nothing of it.
	if !o.Unanswered && !o.ClientGone && (o.Status > 0 || o.StreamError) {
		r.g.answered(r.p, r.served, failedAnswer(o))
	}
	// The load summary judges the endpoint: a client that left mid-response
	// does not hide how the endpoint was answering.
	window := code
	switch {
	case o.ClientGone && o.Status > 0:
		window = proxy.Code(o.Status)
	case o.EndpointsFailed:
		window = proxy.Code(http.StatusBadGateway)
	}
	r.g.countAs(r.p.name, r.model, endpoint, code, window)
	if endpoint != "" {
		r.served.countMinute(r.g.now())
	}
	// A whole stream's tokens after the first give its step time.
	if !r.firstAt.IsZero() && o.UsageSeen && o.CompletionTokens > 1 && !o.StreamError && !o.ClientGone && o.Status < 300 {
		step := r.g.now().Sub(r.firstAt).Seconds() / float64(o.CompletionTokens-1)
		r.served.speed.ObserveStep(r.running, step, r.p.poolSpeed())
		r.g.answeredSpeed(peers.Answer{Endpoint: r.served.addr, Step: true, Running: r.running, Seconds: step})
	}
	if !o.Unanswered {
		r.g.observeDuration(r.p.name, window, r.g.now().Sub(r.start))
	}
	r.release()
	r.finished = true
}

func (r *Route) release() {
	r.served.release()
	r.mu.Lock()
	if r.dispatched {
		r.g.fleet.Completed(r.ticket)
		r.dispatched = false
	}
	r.mu.Unlock()
	r.g.touch()
	r.g.freed.signal()
}
