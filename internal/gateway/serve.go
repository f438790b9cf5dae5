package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/schedule"
)

// statusClientClosed is nginx's 499: the client closed the request first.
const statusClientClosed = 499

// Message for a model no scheduler serves, as AWS's gateway words it.
const noMatchingModel = "no matching model: set the model in the request body or the x-gateway-model-name header"

var headPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// hashPool holds prompt block-hash slices.
var hashPool = sync.Pool{New: func() any { s := make([]uint64, 0, prefix.DefaultMaxBlocks); return &s }}

// maxWholeBody bounds the bodies kept whole for sending (see replayBody.whole):
// past the transport's 32 KiB write buffer the writes split anyway.
const maxWholeBody = 32 << 10

var copyPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ServeHTTP implements the OpenAI data plane.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := proxy.RequestID(r.Header)
	w.Header().Set("X-Request-Id", rid)
	if r.URL.Path == "/v1/models" {
		g.serveModels(w, r)
		return
	}
	if !proxy.Proxied(r.URL.Path) {
		g.reject(w, nil, "", http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		g.reject(w, nil, "", http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method "+r.Method+" not allowed; use POST")
		return
	}
	rt := g.routes.Load()
	if rt == nil {
		w.Header().Set("Retry-After", "1")
		g.reject(w, nil, "", http.StatusServiceUnavailable, openai.TypeServer, "the gateway has no configuration yet")
		return
	}
	if r.ContentLength > rt.maxBody {
		g.refuse(w, nil, "", proxy.TooLarge(rt.maxBody))
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(start.Add(g.opts.BodyReadTimeout))
	body := http.MaxBytesReader(w, r.Body, rt.maxBody)

	// The model: the header overrides, else the body, read only up to the model.
	head := headPool.Get().(*bytes.Buffer)
	head.Reset()
	defer func() {
		// A body whose model came late may have grown the buffer large; keep only
		// modest buffers for reuse.
		if head.Cap() <= 1<<20 {
			headPool.Put(head)
		}
	}()
	model := r.Header.Get("X-Gateway-Model-Name")
	var prompt []byte
	if model == "" || rt.promptLimit > 0 {
		scan := openai.Scan
		if model != "" {
			scan = openai.ScanPrompt // only the prompt's head is needed
		}
		sc, err := scan(body, head, rt.promptLimit)
		if model == "" {
			if ref, ok := proxy.BodyError(err); ok {
				g.log.Debug("reading request body", "request_id", rid, "err", err)
				g.refuse(w, nil, "", ref)
				return
			}
			if !sc.ModelFound {
				g.reject(w, nil, "", http.StatusBadRequest, openai.TypeInvalidRequest, noMatchingModel)
				return
			}
			model = sc.Model
		}
		// With the model in a header the body is the model server's business: a
		// body the scan cannot read only goes without prefix affinity.
		if err == nil {
			prompt = sc.Prompt
		}
	}
	p := rt.byModel[model]
	if p == nil {
		// The model label stays empty: a client must not mint metric series.
		g.reject(w, nil, "", http.StatusNotFound, openai.TypeNotFound, noMatchingModel)
		return
	}

	ctx := r.Context()
	if t := p.spec.Timeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, start.Add(t))
		defer cancel()
	}

	// Admission and the pick, which reserves the chosen endpoint's slot.
	limit := rt.gw.InFlightLimit()
	scratch := snapshotPool.Get().(*snapshotScratch)
	defer snapshotPool.Put(scratch)
	hb := hashPool.Get().(*[]uint64)
	defer hashPool.Put(hb)
	d, code, msg := g.decide(ctx, decideArgs{rid: rid, p: p, model: model, prompt: prompt, limit: limit, wait: rt.gw.QueueWait(), start: start,
		priority: rt.priorityOf(r.Header.Get(ObjectiveHeader))}, scratch, hb)
	if code != 0 {
		if code != http.StatusGatewayTimeout {
			w.Header().Set("Retry-After", "1")
		}
		g.reject(w, p, model, code, openai.TypeOverloaded, msg)
		return
	}

	rb := newReplayBody(head.Bytes(), body, rt.gw.RetryBuffer())
	switch {
	case r.ContentLength == 0 && head.Len() == 0:
		rb.rest = nil
	case r.ContentLength == int64(head.Len()) && head.Len() <= maxWholeBody:
		// A copy: the head buffer goes back to the pool when this handler returns,
		// and the transport may still hold the body then.
		rb.whole = bytes.Clone(head.Bytes())
	}
	// Runs before the head buffer goes back to the pool: a transport still holding
	// the last attempt's reader must not read it afterwards.
	defer rb.detach()
	explain := r.Header.Get("X-Kvgate-Explain") == "1"
	size := r.ContentLength
	if size < 0 {
		size = int64(head.Len())
	}
	g.forward(ctx, w, r, forwardJob{p: p, model: model, decision: d.decision, first: d.first, limit: limit, body: rb, rid: rid, start: start,
		promptTokens: int(size / 4), hashes: d.hashes, cands: d.cands,
		attempts: rt.gw.Attempts(), explain: explain, client: r.Context()})
}

// decideArgs are the inputs of one routing decision.
type decideArgs struct {
	rid    string
	p      *pool
	model  string
	prompt []byte // the raw head of the prompt, for prefix affinity
	// subset, when not nil, restricts the pick to these addresses (the Endpoint
	// Picker protocol's subset hint).
	subset []string
	limit  int
	wait   time.Duration
	start  time.Time
	// priority orders waiting requests (spec.objectives); below 0 a request
	// is refused rather than wait.
	priority int32
}

// decided is a pick: the ranked decision, the candidates as the picker saw them
// (they live in the scratch the decision was made with), the prompt's block
// hashes and the reserved first endpoint.
type decided struct {
	decision schedule.Decision
	cands    []schedule.Endpoint
	hashes   []uint64
	first    *endpoint
}

// decide hashes the prompt's head, waits for admission and picks, reserving the
// best endpoint. It returns the status and message of a refusal, or code 0.
func (g *Gateway) decide(ctx context.Context, a decideArgs, sc *snapshotScratch, hb *[]uint64) (decided, int, string) {
	p := a.p
	req := schedule.Request{Model: a.model}
	if a.model != p.spec.ModelName {
		req.Adapter = a.model
	}
	var d decided
	if pc := p.prefix; pc.blockChars > 0 && len(a.prompt) >= pc.blockChars {
		d.hashes = prefix.Hashes((*hb)[:0], a.prompt, pc.blockChars, pc.maxBlocks, pc.seeds[a.model])
		*hb = d.hashes
	}
	var code int
	var msg string
	d.decision, d.cands, d.first, code, msg = g.choose(ctx, p, req, d.hashes, a, sc)
	if code != 0 {
		return d, code, msg
	}
	g.m.Decision.Observe(time.Since(a.start).Seconds())
	if n := g.decisions.Add(1); n%uint64(g.opts.DecisionLogEvery) == 0 && g.log.Enabled(ctx, slog.LevelDebug) {
		g.log.Debug("decision", "request_id", a.rid, "scheduler", p.name, "model", a.model, "chosen", d.first.addr,
			"candidates", explain(d.decision), "sampled_every", g.opts.DecisionLogEvery)
	}
	if p.prefix.blockChars > 0 {
		if i := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == d.first.addr }); i >= 0 {
			g.m.PrefixMatch.WithLabelValues(p.name).Observe(d.cands[i].PrefixMatch)
		}
	}
	return d, 0, ""
}

// choose waits, up to a.wait, for an endpoint of p below a.limit, ranks the
// candidates and reserves the best one it can. It returns the decision and the
// reserved endpoint, or the status and message of a refusal.
func (g *Gateway) choose(ctx context.Context, p *pool, req schedule.Request, hashes []uint64, a decideArgs, sc *snapshotScratch) (schedule.Decision, []schedule.Endpoint, *endpoint, int, string) {
	limit := a.limit
	if len(p.endpoints) == 0 {
		g.m.Shed.WithLabelValues(p.name, "no_endpoint").Inc()
		return schedule.Decision{}, nil, nil, http.StatusServiceUnavailable, fmt.Sprintf("no ready endpoint for model %q", p.spec.ModelName)
	}
	if a.subset != nil && !slices.ContainsFunc(p.endpoints, func(e *endpoint) bool { return slices.Contains(a.subset, e.addr) }) {
		g.m.Shed.WithLabelValues(p.name, "no_endpoint").Inc()
		return schedule.Decision{}, nil, nil, http.StatusServiceUnavailable, fmt.Sprintf("no endpoint of model %q is in the proxy's subset hint", p.spec.ModelName)
	}
	var timer *time.Timer
	expired := false
	// A request registers as waiting, for the endpoints it could use, once it
	// has to wait — or at once when others already wait, so that a freed slot
	// it is more important for is not taken by one woken meanwhile. Sheddable
	// requests never wait.
	var usable []*endpoint
	registered := false
	register := func() {
		if registered || a.priority < 0 {
			return
		}
		for _, e := range p.endpoints {
			if a.subset == nil || slices.Contains(a.subset, e.addr) {
				usable = append(usable, e)
			}
		}
		g.waiting.add(usable, a.priority)
		registered = true
	}
	defer func() {
		if registered && g.waiting.remove(usable, a.priority) {
			g.freed.signal() // those that let this one go first look again
		}
	}()
	if g.waiting.n.Load() > 0 {
		register()
	}
	for {
		woken := g.freed.wait()
		// A request lets the more important ones waiting for an endpoint take
		// it first.
		if cands := g.waiting.usable(p, p.snapshot(g.fleet, g.prefix, hashes, limit, a.subset, sc), a.priority); len(cands) > 0 {
			d := p.picker.Pick(req, cands)
			for _, c := range d.Ranked {
				if ep := p.endpoint(c.Address); ep != nil && ep.tryAcquire(limit) {
					return d, cands, ep, 0, ""
				}
			}
		}
		if a.priority < 0 {
			g.m.Shed.WithLabelValues(p.name, "sheddable").Inc()
			return schedule.Decision{}, nil, nil, http.StatusTooManyRequests, fmt.Sprintf("every endpoint of model %q is busy and the request's objective is sheddable; retry later", p.spec.ModelName)
		}
		if expired {
			g.m.Shed.WithLabelValues(p.name, "saturated").Inc()
			return schedule.Decision{}, nil, nil, http.StatusTooManyRequests, fmt.Sprintf("every endpoint of model %q is at its limit of %d requests in flight; retry later", p.spec.ModelName, limit)
		}
		if timer == nil {
			timer = time.NewTimer(a.wait)
			defer timer.Stop()
		}
		register()
		select {
		case <-woken:
		case <-timer.C:
			expired = true // one last look before refusing
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return schedule.Decision{}, nil, nil, statusClientClosed, "the client went away while waiting for an endpoint"
			}
			return schedule.Decision{}, nil, nil, http.StatusGatewayTimeout, "route timeout exceeded while waiting for an endpoint"
		}
	}
}

// reject answers with an OpenAI error and counts it.
func (g *Gateway) reject(w http.ResponseWriter, p *pool, model string, code int, typ, msg string) {
	g.refuse(w, p, model, &proxy.Refusal{Status: code, Type: typ, Message: msg})
}

// refuse answers with a refusal and counts it.
func (g *Gateway) refuse(w http.ResponseWriter, p *pool, model string, ref *proxy.Refusal) {
	sched := ""
	if p != nil {
		sched = p.name
	}
	g.count(sched, model, "", strconv.Itoa(ref.Status))
	ref.Write(w)
}

type forwardJob struct {
	p        *pool
	model    string
	decision schedule.Decision
	first    *endpoint // reserved by choose
	limit    int
	// promptTokens estimates the prompt's size for the fleet's KV accounting, from
	// the body's length (about four bytes a token).
	promptTokens int
	body         *replayBody
	// hashes are the prompt's prefix blocks, recorded against each endpoint the
	// request is sent to; cands are the endpoints as the picker saw them.
	hashes   []uint64
	cands    []schedule.Endpoint
	rid      string
	start    time.Time
	attempts int
	explain  bool
	client   context.Context // the client's request context
}

// forward sends the request to the ranked endpoints in turn until one answers, and
// streams that answer to the client. The first endpoint arrives reserved; a
// fallback is used only if it has a free slot.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, j forwardJob) {
	ranked := j.decision.Ranked
	if len(ranked) > j.attempts {
		ranked = ranked[:j.attempts]
	}
	var lastErr error
	for i, cand := range ranked {
		ep := j.first
		if i > 0 {
			if ep = j.p.endpoint(cand.Address); ep == nil || !ep.tryAcquire(j.limit) {
				continue
			}
		}
		// The fleet counts the request toward the endpoint's queue and KV until the
		// endpoint's own metrics show it.
		ticket := g.fleet.Dispatched(ep.addr, j.promptTokens)
		if len(j.hashes) > 0 {
			var m engine.Metrics
			if i := slices.IndexFunc(j.cands, func(e schedule.Endpoint) bool { return e.Address == ep.addr }); i >= 0 {
				m = j.cands[i].Metrics
			}
			g.prefix.Record(ep.addr, j.hashes, j.p.prefix.capacityOf(m))
		}
		done := func() {
			ep.release()
			g.fleet.Completed(ticket)
			g.freed.signal()
		}
		body, ok := j.body.next()
		if !ok {
			done()
			break
		}
		attemptCtx, cancel := context.WithCancel(ctx)
		out := g.upstreamRequest(attemptCtx, r, j, body, ep)
		resp, err := j.p.transport.RoundTrip(out)
		if err == nil && resp.StatusCode >= 500 && i < len(ranked)-1 {
			// Worth another endpoint, if the body can still be sent whole.
			if j.body.canReplay() {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				cancel()
				done()
				g.m.Retries.WithLabelValues(j.p.name, "status").Inc()
				g.log.Warn("endpoint answered with a server error; trying the next", "request_id", j.rid, "endpoint", ep.addr, "status", resp.StatusCode)
				lastErr = fmt.Errorf("endpoint %s answered %s", ep.addr, resp.Status)
				continue
			}
		}
		if err != nil {
			cancel()
			done()
			lastErr = err
			if ctx.Err() != nil || j.body.clientError() != nil {
				break
			}
			g.m.Retries.WithLabelValues(j.p.name, "connect").Inc()
			g.log.Warn("endpoint failed before responding", "request_id", j.rid, "endpoint", ep.addr, "err", err)
			continue
		}
		// Deferred so that a relay that aborts the connection still releases.
		defer func() {
			resp.Body.Close()
			cancel()
			done()
		}()
		g.relay(ctx, w, resp, j, ep, ticket)
		return
	}
	// No endpoint answered.
	code, typ, msg := http.StatusBadGateway, openai.TypeServer, "no endpoint could serve the request"
	cerr := j.body.clientError()
	// The client's own errors first: a body that stalls past its read deadline
	// also cancels the request's context (net/http does on a read error), and
	// the client, still there, is owed its 408.
	ref, bodyFailed := proxy.BodyError(cerr)
	switch {
	case bodyFailed && ref.Status != http.StatusBadRequest:
		g.refuse(w, j.p, j.model, ref)
		return
	case r.Context().Err() != nil:
		g.count(j.p.name, j.model, "", "499")
		return
	case bodyFailed:
		g.refuse(w, j.p, j.model, ref)
		return
	case ctx.Err() != nil:
		code, msg = http.StatusGatewayTimeout, "route timeout exceeded before an endpoint answered"
	case lastErr != nil:
		// The endpoint's address and Go's error text stay in the log.
		g.log.Warn("no endpoint could serve the request", "request_id", j.rid, "scheduler", j.p.name, "err", lastErr)
	}
	g.reject(w, j.p, j.model, code, typ, msg)
}

// upstreamRequest builds the request to one endpoint.
func (g *Gateway) upstreamRequest(ctx context.Context, r *http.Request, j forwardJob, body io.ReadCloser, ep *endpoint) *http.Request {
	out := (&http.Request{
		Method: http.MethodPost, URL: &url.URL{Scheme: "http", Host: ep.addr, Path: r.URL.Path, RawQuery: r.URL.RawQuery},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: make(http.Header, len(r.Header)+2), Body: body, Host: ep.addr,
		ContentLength: r.ContentLength,
	}).WithContext(ctx)
	// Lets the client send the request again on a fresh connection when a pooled one
	// turns out to have been closed by the server, as long as the body still fits the
	// replay buffer.
	out.GetBody = func() (io.ReadCloser, error) {
		rc, ok := j.body.next()
		if !ok {
			return nil, errors.New("request body no longer replayable")
		}
		return rc, nil
	}
	proxy.RequestHeaders(out.Header, r.Header, r.RemoteAddr, j.rid, proxy.IsControlHeader)
	return out
}

// relay streams an endpoint's response to the client, flushing server-sent events
// as they arrive and ending a stream that breaks with an explicit error event.
func (g *Gateway) relay(ctx context.Context, w http.ResponseWriter, resp *http.Response, j forwardJob, ep *endpoint, ticket fleet.Ticket) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	proxy.RemoveHopHeaders(h)
	h.Del("Content-Length") // the body is relayed as it comes
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	h.Set("X-Kvgate-Endpoint", ep.addr)
	h.Set("X-Kvgate-Scheduler", j.p.name)
	if j.explain {
		h.Set("X-Kvgate-Scores", explain(j.decision))
	}
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	rc := http.NewResponseController(w)
	obs := usageObserver{sse: sse}
	bufp := copyPool.Get().(*[]byte)
	defer copyPool.Put(bufp)
	buf := *bufp
	first := true
	var readErr error
	clientGone := false
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if first {
				first = false
				g.fleet.FirstToken(ticket)
				g.observeTTFT(j.p.name, time.Since(j.start), sse)
			}
			obs.feed(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				clientGone = true
				break
			}
			// With the end of the body read in the same call, the data goes out
			// with the response's last chunk when the handler returns: one write,
			// and the client wakes once.
			if sse && err == nil {
				if ferr := rc.Flush(); ferr != nil {
					clientGone = true
					break
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	code := strconv.Itoa(resp.StatusCode)
	window := code // what the load summary counts
	switch {
	case clientGone, readErr != nil && j.client.Err() != nil:
		code = "499" // the client went away; its upstream request is cancelled with it
	case readErr != nil:
		g.m.StreamErrors.WithLabelValues(j.p.name).Inc()
		// The error's text (addresses, Go's wording) stays in the log below.
		msg, status := "the model server failed mid-response", http.StatusBadGateway
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg, status = "route timeout exceeded mid-response", http.StatusGatewayTimeout
		}
		g.log.Warn("response broke after bytes reached the client", "request_id", j.rid, "endpoint", ep.addr, "err", readErr)
		window = "incomplete"
		if !sse {
			// Headers are out and the body is not a stream of events: cut the
			// connection so the client cannot take a truncated body for a whole one.
			g.countAs(j.p.name, j.model, ep.addr, code, window)
			panic(http.ErrAbortHandler)
		}
		event, _ := json.Marshal(openai.ErrorBody{Error: openai.ErrorDetail{Message: msg, Type: openai.TypeServer, Code: status}})
		fmt.Fprintf(w, "data: %s\n\n", event)
		_ = rc.Flush()
	default:
		obs.finish()
		if obs.seen {
			g.m.Tokens.WithLabelValues(j.p.name, "prompt").Add(float64(obs.prompt))
			g.m.Tokens.WithLabelValues(j.p.name, "completion").Add(float64(obs.output))
		}
	}
	g.countAs(j.p.name, j.model, ep.addr, code, window)
	g.observeDuration(j.p.name, window, time.Since(j.start))
	g.log.Debug("served", "request_id", j.rid, "scheduler", j.p.name, "model", j.model, "endpoint", ep.addr, "status", resp.StatusCode, "code", code,
		"duration", time.Since(j.start))
}

// explain renders the candidates' scores for x-kvgate-scores:
// "addr score k=v k=v, addr score ...".
func explain(d schedule.Decision) string {
	var b strings.Builder
	for i, c := range d.Ranked {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.3f", c.Address, c.Score)
		for k, v := range c.Scores.All() {
			fmt.Fprintf(&b, " %s=%.3f", k, v)
		}
	}
	return b.String()
}
