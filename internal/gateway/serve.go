package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/tracing"
)

// headPool holds the buffers a request's body head is read into.
var headPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxWholeBody bounds the bodies kept whole for sending (see proxy.ReplayBody.SetWhole):
// past the transport's 32 KiB write buffer the writes split anyway.
const maxWholeBody = 32 << 10

// ServeHTTP implements the OpenAI data plane.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	counted := &countingBody{ReadCloser: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = counted
	}
	g.serve(w, r)
	// Once the answer is out and everything held is given back (not after a
	// panic: the server answers that itself), the rest of a body the answer
	// did not need is read and dropped.
	linger(w, r, counted)
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := proxy.RequestID(r.Header)
	w.Header().Set("X-Request-Id", rid)
	// The request's span and access-log line (tracing.go); nil when both are off.
	tr, r := tracing.Start(g.opts.Tracing, g.opts.AccessLog, r, start, rid)
	if tr != nil {
		w = tr.Wrap(w)
		defer func() { tr.End(tracing.WrittenStatus(w)) }()
	}
	// One configuration for the whole request: a reload meanwhile changes
	// nothing of its rules.
	cfg := g.core.Current()
	// Before anything else: an unauthenticated client learns nothing, not
	// even which paths exist.
	id, aref := cfg.Authenticate(r.Header, r.RemoteAddr)
	if aref != nil {
		// Debug: scanners probing the front door would flood Info, and the
		// refusals are counted (kvgate_auth_requests_total).
		g.log.Debug("request not authenticated", "request_id", rid, "status", aref.Status, "remote", r.RemoteAddr)
		aref.Write(w)
		return
	}
	if r.URL.Path == "/v1/models" || strings.HasPrefix(r.URL.Path, "/v1/models/") {
		serveModels(w, r, cfg.Models(id))
		return
	}
	if !proxy.Proxied(r.URL.Path) {
		g.refuse(w, nil, proxy.NoRoute(r.Method, r.URL.Path))
		return
	}
	if r.Method != http.MethodPost {
		g.refuse(w, nil, proxy.MethodNotAllowed(r.Method))
		return
	}
	if !cfg.Configured() {
		g.refuse(w, nil, proxy.NoConfiguration())
		return
	}
	maxBody := cfg.MaxBody()
	if r.ContentLength > maxBody {
		g.refuse(w, nil, proxy.TooLarge(maxBody))
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(start.Add(g.opts.BodyReadTimeout))
	body := http.MaxBytesReader(w, r.Body, maxBody)

	// The model: the body's, read only as far as routing needs, or the header's
	// when the body names none. The body may not name another (nor name one
	// twice): what the model server runs is what was routed. Its head is held
	// once, reserved from the gateway's budget for bodies as it grows.
	head := headPool.Get().(*bytes.Buffer)
	head.Reset()
	defer func() {
		// A body whose model came late may have grown the buffer; keep only
		// modest buffers for reuse.
		if head.Cap() <= 2<<20 {
			headPool.Put(head)
		}
	}()
	hold := g.bodies.hold(cfg.MaxBuffered(), g.core.Metrics())
	defer hold.Done()
	// The head's bytes the scan let go of, in order; the chunks go back to
	// their pool after the last attempt's reader is detached (deferred later).
	parts := &headParts{m: &g.bodies, hold: hold}
	defer parts.done()
	model, err := openai.HeaderModel(r.Header.Values(proxy.ModelHeader))
	if ref, ok := proxy.BodyError(err); ok {
		g.refuse(w, nil, ref)
		return
	}
	scanning := int64(scanBuffer)
	if r.ContentLength >= 0 {
		scanning = min(scanning, r.ContentLength)
	}
	var sc openai.Scanned
	err = errOverBudget
	if hold.Reserve(scanning) {
		sc, err = openai.ScanFor(body, head, openai.Want{PromptLimit: cfg.PromptLimit(), HeaderModel: model, User: cfg.WantsUser(), Spill: parts.add})
		hold.Release(scanning)
		if err == nil && !hold.Reserve(int64(head.Len())) {
			err = errOverBudget
		}
	}
	if errors.Is(err, errOverBudget) {
		g.core.Metrics().BufferRefused.Inc()
		g.refuse(w, nil, overBudget)
		return
	}
	if ref, ok := proxy.BodyError(err); ok {
		g.log.Debug("reading request body", "request_id", rid, "err", err)
		g.refuse(w, nil, ref)
		return
	}
	if model == "" {
		if !sc.ModelFound {
			g.refuse(w, nil, proxy.MissingModel())
			return
		}
		model = sc.Model
	}
	prompt, user := sc.Prompt, sc.User
	headLen := int64(head.Len()) + parts.size()
	size := r.ContentLength
	if size < 0 {
		size = headLen
	}
	// Admission and the pick, which reserves the chosen endpoint's slot.
	rt, ref := cfg.Route(r.Context(), route.Request{RequestID: rid, Model: model, Prompt: prompt, BodyBytes: size, Start: start,
		Objective: r.Header.Get(proxy.ObjectiveHeader), Explain: r.Header.Get("X-Kvgate-Explain") == "1", Header: r.Header.Get, User: user,
		Identity: id, Trace: routing(tr, model, id), BodyPending: r.ContentLength != headLen})
	if ref != nil {
		ref.Write(w) // counted by Route
		return
	}
	ctx := r.Context()
	if at, ok := rt.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, at)
		defer cancel()
	}
	// The rest streams on, checked for another model as it goes.
	rb := proxy.NewReplayParts(append(parts.parts, head.Bytes()), openai.GuardReader(body, sc.Rest), rt.RetryBuffer)
	restSize := int64(-1)
	if r.ContentLength >= 0 {
		restSize = r.ContentLength - headLen
	}
	rb.SetHold(hold, restSize)
	switch {
	case r.ContentLength == 0 && headLen == 0:
		rb.SetEmpty()
	case r.ContentLength == headLen && headLen <= maxWholeBody:
		// A copy: the head buffer goes back to the pool when this handler returns,
		// and the transport may still hold the body then.
		rb.SetWhole(bytes.Clone(head.Bytes()))
	}
	// Runs before the head buffer goes back to the pool: a transport still holding
	// the last attempt's reader must not read it afterwards.
	defer rb.Detach()
	g.forward(ctx, w, r, rt, rb, rid, cfg.AuthEnabled())
}

// refuse answers with a refusal the routing core did not see, and counts it.
func (g *Gateway) refuse(w http.ResponseWriter, rt *route.Route, ref *proxy.Refusal) {
	if rt != nil {
		rt.Finish(route.Outcome{Status: ref.Status, Unanswered: true})
	} else {
		g.core.CountRefused(ref.Status)
	}
	ref.Write(w)
}

// forward sends the request to the route's ranked endpoints in turn until one
// answers, and streams that answer to the client (proxy.Forward). The first
// endpoint arrives reserved; a fallback is used only if it has a free slot.
// Nothing goes to the client before the answer's first bytes: an endpoint that
// fails before them is retried like one that never answered.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, rt *route.Route, body *proxy.ReplayBody, rid string, authenticated bool) {
	// Releases the endpoint if a hook panics; after Finish it does nothing.
	defer rt.Finish(route.Outcome{})
	targets := make([]proxy.Target, len(rt.Endpoints))
	for i, addr := range rt.Endpoints {
		targets[i] = proxy.Target{Name: addr, URL: &url.URL{Scheme: rt.Scheme(), Host: addr}}
	}
	sched := rt.Scheduler()
	tr := g.traceOf(ctx)
	routed(tr, rt)
	retry := "" // why the last attempt failed, counted when the next one starts
	status := 0 // the committed answer's
	res := proxy.Forward(w, &proxy.Job{Targets: targets, Transport: rt.Transport(), Body: body, Request: r, Ctx: ctx,
		RequestID: rid, Policy: proxy.HeaderPolicy{Tier: proxy.Tier1, StripCredentials: authenticated}, RetryStatus: retryStatus, MidStreamMessage: "the model server failed mid-response",
		WaitFirstByte: true, FirstByteTimeout: rt.FirstByteTimeout, IdleTimeout: rt.StreamIdleTimeout, WriteTimeout: rt.ClientWriteTimeout,
		Acquire: func(i int) (func(), bool) {
			if i == 0 {
				return nil, true
			}
			if !rt.Retry(rt.Endpoints[i]) {
				return nil, false
			}
			g.core.Metrics().Retries.WithLabelValues(sched, retry).Inc()
			return nil, true
		},
		Watch: func(ctx context.Context, i int, giveUp func(error)) { g.watcher.watch(ctx, rt, i, giveUp) },
		OnFailure: func(i int, e *proxy.AttemptError) {
			defer func() { tr.Failed(i, e.Status, retry, e) }() // retry, once set below
			// An endpoint the fleet found down is not an outlier among healthy
			// ones: counting its waits would keep it ejected once it is back.
			if !errors.Is(e.Err, errEndpointLost) {
				rt.Failed(e.Target)
			}
			switch {
			case e.Status != 0:
				retry = "status"
				g.log.Warn("endpoint answered with an error worth another endpoint; trying the next", "request_id", rid, "endpoint", e.Target, "status", e.Status)
				return
			case errors.Is(e.Err, errEndpointLost):
				retry = "unhealthy"
			case errors.Is(e.Err, proxy.ErrTimeout):
				retry = "timeout"
			default:
				retry = "connect"
			}
			g.log.Warn("endpoint failed before its first byte; trying the next", "request_id", rid, "endpoint", e.Target, "err", e.Err)
		},
		OnCommit: func(_, st int, h http.Header) {
			status = st
			if rt.Expose {
				h.Set("X-Kvgate-Endpoint", rt.Served())
			}
			h.Set("X-Kvgate-Scheduler", sched)
			if rt.Scores != "" {
				h.Set("X-Kvgate-Scores", rt.Scores)
			}
		},
		OnFirstByte: func(i int, sse bool) { rt.FirstByte(status, sse); tr.FirstByte(i) },
		// The endpoint's time to first token runs from when it had the whole
		// request: a client that uploads slowly does not make it look slow.
		OnSent:    func(i int) { rt.Sent(rt.Endpoints[i]) },
		Replace:   func(status int) *proxy.Refusal { return serverError(status, rid) },
		OnAttempt: attempting(tr, targets),
	})
	forwarded(tr, rt, &res)
	if !res.Committed {
		// Every endpoint down or failing is the pool unavailable: worth a retry
		// soon, as AWS's gateway and kvgate global answer it.
		ref := res.Unserved("route timeout exceeded before an endpoint answered (routeTimeout)",
			&proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Message: "no endpoint could serve the request; retry later (request id " + rid + ")", RetryAfter: 1})
		if ref == nil {
			rt.Finish(route.Outcome{Unanswered: true}) // the client went away: 499
			return
		}
		if res.Err != nil {
			// The endpoint's address and Go's error text stay in the log.
			g.log.Warn("no endpoint could serve the request", "request_id", rid, "scheduler", sched, "status", ref.Status, "err", res.Err)
		}
		rt.Finish(route.Outcome{Status: ref.Status, Unanswered: true, EndpointsFailed: ref.Status == http.StatusServiceUnavailable})
		ref.Write(w)
		return
	}
	if res.Replaced != nil {
		// What the model server said stays here: the client gets the status
		// and the request id to quote.
		g.log.Warn("endpoint answered with a server error; relayed as the gateway's own", "request_id", rid, "err", res.Err,
			"body", string(res.Replaced))
	}
	o := route.Outcome{Status: res.Status, ClientGone: res.ClientGone, StreamError: res.Code == proxy.CodeStreamError,
		PromptTokens: res.Usage.Prompt, CompletionTokens: res.Usage.Completion, UsageSeen: res.Usage.Seen && res.Code == proxy.Code(res.Status)}
	if o.StreamError {
		g.log.Warn("response broke after bytes reached the client", "request_id", rid, "endpoint", rt.Served(), "err", res.Err)
	}
	rt.Finish(o)
	g.log.Debug("served", "request_id", rid, "scheduler", sched, "model", rt.Model(), "endpoint", rt.Served(), "status", res.Status, "code", res.Code)
	if res.Abort {
		// Headers are out and the body is not a stream of events: cut the
		// connection so the client cannot take a truncated body for a whole one.
		panic(http.ErrAbortHandler)
	}
}

// serverError is the answer to a model server's 5xx, in place of its own,
// whose body may carry a stack trace, addresses or a sidecar's wording: the
// status, and the request id the log knows it by.
func serverError(status int, rid string) *proxy.Refusal {
	if status < 500 {
		return nil
	}
	ref := &proxy.Refusal{Status: status, Type: openai.TypeServer,
		Message: fmt.Sprintf("the model server failed to answer (%d %s); request id %s", status, http.StatusText(status), rid)}
	if status == http.StatusServiceUnavailable {
		ref.RetryAfter = 1
	}
	return ref
}

// retryStatus: a model server's 5xx, or its 429 (it is overloaded, others may
// not be), is worth another endpoint.
func retryStatus(status int) bool { return status >= 500 || status == http.StatusTooManyRequests }

// errEndpointLost gives up on an endpoint that the fleet stopped reading as
// healthy and fresh while the request waited for its first byte (frozen or gone).
var errEndpointLost = errors.New("the endpoint turned unhealthy or stale before answering")

// watcher looks, every watchEvery, at the endpoints requests wait on for their
// first byte, and gives up on those the fleet no longer reads as usable. One
// goroutine for all of them, running only while some request waits: the hot
// path adds an entry, not a goroutine or a timer.
type watcher struct {
	mu      sync.Mutex
	waiting map[*watched]struct{}
}

type watched struct {
	ctx    context.Context
	rt     *route.Route
	i      int
	giveUp func(error)
}

// watch registers an attempt at rt.Endpoints[i] until ctx ends.
func (w *watcher) watch(ctx context.Context, rt *route.Route, i int, giveUp func(error)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting == nil {
		w.waiting = map[*watched]struct{}{}
	}
	if len(w.waiting) == 0 {
		go w.run()
	}
	w.waiting[&watched{ctx: ctx, rt: rt, i: i, giveUp: giveUp}] = struct{}{}
}

func (w *watcher) run() {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for range t.C {
		w.mu.Lock()
		var lost []*watched
		for a := range w.waiting {
			switch {
			case a.ctx.Err() != nil:
				delete(w.waiting, a)
			case a.rt.Lost(a.i):
				delete(w.waiting, a)
				lost = append(lost, a)
			}
		}
		idle := len(w.waiting) == 0
		w.mu.Unlock()
		for _, a := range lost {
			a.giveUp(errEndpointLost)
		}
		if idle {
			return
		}
	}
}

// watchEvery is how often a request waiting for its first byte looks at its
// endpoint's health: the fleet's scrape interval is 50 ms by default.
const watchEvery = 100 * time.Millisecond
