// Package global is kvgate's tier-2 router (`kvgate global`): one
// OpenAI-compatible front door over member clusters, each a tier-1 `kvgate
// serve`. It follows each member's load summary (its heartbeat), picks per
// request by the model served, health, headroom, error rate, region and price —
// cheaper members first while their predicted TTFT stays inside the SLO —,
// fails over to the next member for requests that had not started streaming,
// ramps returning members up gradually, and enforces per-tenant and per-model
// limits shared by all replicas through Redis.
package global

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/tracing"
)

// Admission is a rate limiter's answer for one request.
type Admission struct {
	Allowed    bool
	RetryAfter time.Duration
	// TooLarge: the request alone exceeds a tokens-per-minute limit; waiting
	// does not help.
	TooLarge bool
	// Headers are the x-ratelimit-* headers to send, allowed or not.
	Headers http.Header
	// Reconcile settles the reservation with the tokens the request really
	// used; Cancel gives it back whole, for a request no member served. One of
	// them is called exactly once for an allowed request.
	Reconcile func(ctx context.Context, actualTokens int64)
	Cancel    func(ctx context.Context)
}

// Limiter reserves a request and its estimated tokens against every limit that
// applies to it. An error means the limiter could not decide (Redis down with
// the fail-closed mode): the request is refused with 503.
type Limiter interface {
	Admit(ctx context.Context, tenant, model string, tokens int64) (Admission, error)
}

// Options configure a Router.
type Options struct {
	Logger  *slog.Logger
	Metrics *Metrics
	Auth    *auth.Authenticator // nil: no authentication, every request is tenant ""
	Limiter Limiter             // nil: no rate limiting
	// Transport reaches the members (default: a pooled transport).
	Transport http.RoundTripper
	// BodyReadTimeout bounds receiving a request body (default 60s, as in
	// kvgate serve): a client that stops sending gets 408, not a held request.
	BodyReadTimeout time.Duration
	// Tracing exports a span per request (nil: none); AccessLog writes a
	// line per request (nil: none).
	Tracing   *tracing.Provider
	AccessLog *tracing.AccessLog
	// Admin says who reads /debug/* on the admin listener: kvgate serve's
	// modes (loopback clients only by default).
	Admin host.AdminOptions
}

// Router is the global router's data plane.
type Router struct {
	opts   Options
	log    *slog.Logger
	m      *Metrics
	client *http.Client // heartbeats
	gen    atomic.Pointer[generation]

	mu       sync.Mutex
	draining bool
	pollCtx  context.Context // set by Start: heartbeats of later members run under it
	// The configuration in force and the outcome of the last load, for
	// /debug/config.
	active   *Config
	loadedAt time.Time
	loadErr  error
	// admin guards the admin listener's pages; adminErr is why Options.Admin
	// did not hold (Run refuses to start).
	admin    *host.AdminGate
	adminErr error
}

// generation is one configuration in force: its settings, members and SLOs,
// and the authenticator and limiter built for it. A request keeps the
// generation it started with to its end.
type generation struct {
	s       settings
	members []*member
	slo     map[string]time.Duration // by model
	tslo    map[string]time.Duration // by tenant
	tobj    map[string]string        // objective by tenant
	maxTok  int64
	auth    *auth.Authenticator
	limiter Limiter

	// active counts the requests using the generation; idle is closed when it
	// has been replaced (retired) and the last of them ended.
	active  atomic.Int64
	retired atomic.Bool
	idle    chan struct{}
	once    sync.Once
	// prev is the generation this one replaced, until everything older than
	// this one is idle; done is closed then, after cleanup ran.
	prev    *generation
	done    chan struct{}
	cleanup func()
}

// retireTimeout bounds how long a replaced configuration's requests may hold
// what it alone used (its Redis client, its authenticator, removed members'
// heartbeats).
const retireTimeout = 10 * time.Minute

func newGeneration() *generation {
	return &generation{idle: make(chan struct{}), done: make(chan struct{})}
}

// acquire returns the generation in force, counted as in use until release.
func (r *Router) acquire() *generation {
	for {
		g := r.gen.Load()
		g.active.Add(1)
		if !g.retired.Load() {
			return g
		}
		// Replaced between the load and the count: take the new one.
		g.release()
	}
}

func (g *generation) release() {
	if g.active.Add(-1) == 0 && g.retired.Load() {
		g.once.Do(func() { close(g.idle) })
	}
}

// retire marks g replaced and runs cleanup — releasing what g and older
// generations used and the new one does not — once g and every older
// generation are idle: a dependency or a member's heartbeat may be shared by
// several generations still finishing requests.
func (g *generation) retire(cleanup func()) {
	g.cleanup = cleanup
	g.retired.Store(true)
	if g.active.Load() == 0 {
		g.once.Do(func() { close(g.idle) })
	}
	go func() {
		// A request that never ends (a client that stopped reading, a member
		// that stopped mid-stream) must not hold every later reload's
		// releases: after retireTimeout they go ahead, under it if need be.
		t := time.NewTimer(retireTimeout)
		select {
		case <-g.idle:
		case <-t.C:
		}
		t.Stop()
		if g.prev != nil {
			<-g.prev.done
			g.prev = nil // older generations can go
		}
		if g.cleanup != nil {
			g.cleanup()
		}
		close(g.done)
	}()
}

// New returns a router over cfg's members, with opts.Auth and opts.Limiter;
// Start runs their heartbeats, Apply puts a new configuration in force.
func New(cfg *Config, opts Options) *Router {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second,
			ResponseHeaderTimeout: 5 * time.Minute, DisableCompression: true,
		}
	}
	r := &Router{opts: opts, log: opts.Logger, m: opts.Metrics,
		client: &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, MaxIdleConnsPerHost: 4}}}
	r.admin, r.adminErr = host.NewAdminGate(opts.Admin, opts.Logger)
	r.Apply(cfg, opts.Auth, opts.Limiter, nil)
	return r
}

// Apply puts cfg in force with the authenticator and limiter built for it (nil:
// none). Requests under way finish under the configuration they started with;
// once they and those of older configurations have ended, release (if set)
// runs, to free what the replaced configuration used and cfg does not. A
// member keeps its state — health, ramp, learned capacity, heartbeats — as
// long as its name and URLs stay; one whose URLs changed starts afresh, as a
// new member would. A removed member's heartbeats go on until the requests
// that may still wait on it have ended.
func (r *Router) Apply(cfg *Config, a *auth.Authenticator, l Limiter, release func()) {
	g := newGeneration()
	g.s, g.slo, g.tslo, g.tobj, g.maxTok, g.auth, g.limiter = cfg.Spec.Routing.settings(), map[string]time.Duration{}, map[string]time.Duration{}, map[string]string{}, 1024, a, l
	for _, mp := range cfg.Spec.Models {
		if mp.TTFTSLO != nil {
			g.slo[mp.Name] = mp.TTFTSLO.Duration
		}
	}
	for _, t := range cfg.Spec.Tenants {
		if t.TTFTSLO != nil {
			g.tslo[t.Name] = t.TTFTSLO.Duration
		}
		if t.Objective != "" {
			g.tobj[t.Name] = t.Objective
		}
	}
	if rl := cfg.Spec.RateLimit; rl != nil && rl.DefaultMaxTokens != nil {
		g.maxTok = *rl.DefaultMaxTokens
	}

	r.mu.Lock()
	old := r.gen.Load()
	prev := map[string]*member{}
	if old != nil {
		for _, m := range old.members {
			prev[m.cfg.Name] = m
		}
	}
	var gone []*member
	for _, mc := range cfg.Spec.Members {
		m := prev[mc.Name]
		if m != nil && m.cfg.URL == mc.URL && m.cfg.AdminURL == mc.AdminURL {
			delete(prev, mc.Name)
			m.setPolicy(mc)
			if r.pollCtx != nil && !sameHeartbeat(m.pollSettings, g.s) {
				m.stopPoll()
				r.startPoll(m, g.s)
			}
			g.members = append(g.members, m)
			continue
		}
		if m != nil {
			// Same name, another cluster: the old one's series go with it.
			delete(prev, mc.Name)
			m.removed = true
			gone = append(gone, m)
			r.m.MemberHealthy.DeleteLabelValues(mc.Name)
			r.m.MemberRamp.DeleteLabelValues(mc.Name)
		}
		m = newMember(mc)
		if r.pollCtx != nil {
			r.startPoll(m, g.s)
		}
		g.members = append(g.members, m)
	}
	for name, m := range prev {
		m.removed = true
		gone = append(gone, m)
		r.m.MemberHealthy.DeleteLabelValues(name)
		r.m.MemberRamp.DeleteLabelValues(name)
	}
	g.prev = old
	r.gen.Store(g)
	r.mu.Unlock()

	if old != nil {
		old.retire(func() {
			r.mu.Lock()
			for _, m := range gone {
				m.stopPoll()
			}
			r.mu.Unlock()
			if release != nil {
				release()
			}
		})
	}
}

// sameHeartbeat says whether a member's heartbeats can go on unchanged.
func sameHeartbeat(a, b settings) bool {
	return a.heartbeat == b.heartbeat && a.heartbeatTimeout == b.heartbeatTimeout
}

// Start runs the members' heartbeats until ctx ends, those of members a later
// configuration adds too.
func (r *Router) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pollCtx != nil {
		return // started already
	}
	r.pollCtx = ctx
	g := r.gen.Load()
	for _, m := range g.members {
		r.startPoll(m, g.s)
	}
}

// startPoll runs m's heartbeats with s until the member leaves the
// configuration or the router stops. Called with r.mu held.
func (r *Router) startPoll(m *member, s settings) {
	ctx, cancel := context.WithCancel(r.pollCtx)
	m.stopPoll, m.pollSettings = cancel, s
	go m.poll(ctx, r.client, s, r.log, func() { r.observe(m) })
}

// health returns the settings members' health is judged by: those in force,
// whatever configuration a request started under.
func (r *Router) health() settings { return r.gen.Load().s }

// observe refreshes a member's gauges, unless a reload removed it (its
// series are gone and must stay gone).
func (r *Router) observe(m *member) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.removed {
		return
	}
	v := m.evaluate(time.Now(), r.health())
	r.m.MemberHealthy.WithLabelValues(m.cfg.Name).Set(b2f(v.healthy))
	r.m.MemberRamp.WithLabelValues(m.cfg.Name).Set(v.ramp)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Drain makes /readyz fail, for a graceful stop.
func (r *Router) Drain() {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
}

// ServeHTTP implements the OpenAI front door.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	rid := proxy.RequestID(req.Header)
	w.Header().Set("X-Request-Id", rid)
	// The request's span and access-log line (tracing.go); nil when both are off.
	tr, req := tracing.Start(r.opts.Tracing, r.opts.AccessLog, req, start, rid)
	if tr != nil {
		w = tr.Wrap(w)
		defer func() { tr.End(tracing.WrittenStatus(w)) }()
	}
	g := r.acquire()
	defer g.release()
	tenant := ""
	if g.auth != nil {
		id, err := g.auth.Authenticate(req)
		if err != nil {
			code := http.StatusUnauthorized
			if ae := (*auth.Error)(nil); errors.As(err, &ae) {
				code = ae.StatusCode() // 403, or 429 for a throttled address
			}
			r.m.Requests.WithLabelValues("", "", strconv.Itoa(code)).Inc()
			auth.WriteError(w, err)
			return
		}
		tenant = id.Tenant
	}
	switch {
	case req.URL.Path == "/v1/models" && req.Method == http.MethodGet:
		r.serveModels(w, g)
		return
	case !proxy.Proxied(req.URL.Path):
		r.refusal(w, "", proxy.NoRoute(req.Method, req.URL.Path))
		return
	case req.Method != http.MethodPost:
		r.refusal(w, "", proxy.MethodNotAllowed(req.Method))
		return
	}
	// net/http clears the deadline once the body is read, before it watches
	// the connection for the client going away.
	_ = http.NewResponseController(w).SetReadDeadline(start.Add(cmp.Or(r.opts.BodyReadTimeout, time.Minute)))
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, g.s.maxBody))
	if ref, ok := proxy.BodyError(err); ok {
		r.log.Debug("reading request body", "request_id", rid, "err", err)
		r.refusal(w, "", ref)
		return
	}
	// The model, read as tier 1 reads it: the member runs the body's, so a
	// header naming another (a base model under an adapter's limit, which
	// would let a tenant route around its limit), or a body naming one twice
	// or in a spelling decoders read differently, is refused.
	sc, err := openai.ScanBody(body, openai.Want{HeaderModel: req.Header.Get(proxy.ModelHeader)})
	if ref, ok := proxy.BodyError(err); ok {
		r.refusal(w, "", ref)
		return
	}
	model := sc.Model
	if model == "" {
		r.refusal(w, "", proxy.MissingModel())
		return
	}
	// The token limits only size the reservation, settled with the usage the
	// member reports.
	fields, err := limitFields(body)
	if err != nil {
		ref, _ := proxy.BodyError(&openai.SyntaxError{Err: err})
		r.refusal(w, "", ref)
		return
	}
	// Tokens reserved up front: the prompt at about four bytes a token plus
	// the most the request may generate: the largest of its limits (a model
	// server honours the one its API reads), else the configured default;
	// embeddings generate nothing.
	prompt := int64(len(body)) / 4
	completion := g.maxTok
	if req.URL.Path == "/v1/embeddings" {
		completion = 0
	} else if v := maxOf(fields.MaxTokens, fields.MaxCompletionTokens, fields.MaxOutputTokens); v > 0 {
		completion = min(v, maxCompletion)
	}
	estimate := prompt + completion

	cands, members := g.candidates(model)
	if len(cands) == 0 {
		if !g.known(model) {
			// The model label stays empty: a client must not mint metric series.
			r.refusal(w, "", proxy.UnknownModel())
			return
		}
		r.refusal(w, model, &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeOverloaded,
			Message: fmt.Sprintf("no healthy member serves model %q", model), RetryAfter: 1})
		return
	}
	var adm Admission
	if g.limiter != nil {
		adm, err = g.limiter.Admit(req.Context(), tenant, model, estimate)
		if err != nil {
			if req.Context().Err() != nil {
				r.m.Requests.WithLabelValues("", model, proxy.CodeClientGone).Inc()
				return
			}
			// internal/ratelimit warns of the outage now and then; a line a
			// refused request would flood the log.
			r.log.Debug("rate limiting unavailable; refusing (rateLimit.failMode: closed)", "request_id", rid, "err", err)
			r.refusal(w, model, &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer,
				Message: "rate limiting is unavailable; retry later", RetryAfter: 1})
			return
		}
		for k, vs := range adm.Headers {
			w.Header()[k] = vs
		}
		if !adm.Allowed {
			if adm.TooLarge {
				r.refusal(w, model, &proxy.Refusal{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit,
					Message: fmt.Sprintf("request too large: its %d estimated tokens exceed the tokens-per-minute limit of tenant %q on model %q; send less", estimate, tenant, model)})
				return
			}
			r.refusal(w, model, &proxy.Refusal{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit,
				Message:    fmt.Sprintf("rate limit reached for tenant %q on model %q; retry later", tenant, model),
				RetryAfter: max(1, int((adm.RetryAfter+time.Second-1)/time.Second))})
			return
		}
	}
	policy := Policy{SLO: g.sloFor(model, tenant), ClientRegion: cmp.Or(req.Header.Get(g.s.regionHeader), g.s.region), CrossRegion: g.s.crossRegion,
		MaxErrorRate: g.s.maxErrorRate, PriceBlind: g.s.priceBlind}
	order := Rank(cands, policy, mrand.Float64)
	if len(order) > g.s.maxAttempts {
		order = order[:g.s.maxAttempts]
	}
	st := &settlement{prompt: prompt, stream: fields.Stream != nil && *fields.Stream, objective: g.tobj[tenant], tenant: tenant}
	// Settled once the request is done — deferred, so that a relay that aborts
	// the connection settles too — on a fresh context so that a client that
	// went away still has its tokens counted. A request no member served gives
	// its reservation back whole.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), time.Second)
		defer cancel()
		switch {
		case st.served && adm.Reconcile != nil:
			adm.Reconcile(ctx, st.used)
		case !st.served && adm.Cancel != nil:
			adm.Cancel(ctx)
		}
	}()
	r.forward(w, req, g, rid, model, body, order, members, cands, start, st)
}

// maxCompletion caps a request's completion limit in the token estimate, so
// that an absurd max_tokens cannot overflow it.
const maxCompletion = 1 << 24

// tokenFields are a body's token limits and stream flag.
type tokenFields struct {
	MaxTokens, MaxCompletionTokens, MaxOutputTokens *int64
	Stream                                          *bool
}

// limitFields reads a body's token limits and stream flag by their exact
// names, as the model server reads them: encoding/json's case-insensitive
// match would take "MAX_TOKENS" for max_tokens.
func limitFields(body []byte) (tokenFields, error) {
	var f tokenFields
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return f, errors.New("the body is not a JSON object")
	}
	// The errors name the field, not Go's types: they reach the client.
	for _, k := range []struct {
		name, want string
		dst        any
	}{{"max_tokens", "an integer", &f.MaxTokens}, {"max_completion_tokens", "an integer", &f.MaxCompletionTokens},
		{"max_output_tokens", "an integer", &f.MaxOutputTokens}, {"stream", "a boolean", &f.Stream}} {
		if raw, ok := top[k.name]; ok && json.Unmarshal(raw, k.dst) != nil {
			return f, fmt.Errorf("%s must be %s", k.name, k.want)
		}
	}
	return f, nil
}

func maxOf(vs ...*int64) int64 {
	var m int64
	for _, v := range vs {
		if v != nil && *v > m {
			m = *v
		}
	}
	return m
}

// settlement is what a request used, for its rate-limit reservation, and what
// its attempts send on its behalf.
type settlement struct {
	prompt int64 // the estimate, for a response without usage
	used   int64
	served bool // a member's answer reached the client
	// stream: the client asked for a stream, whose first byte is the first
	// token; a whole JSON answer's first byte comes with its last.
	stream bool
	// objective is the tenant's, sent to the members (x-gateway-inference-objective).
	objective string
	tenant    string // for the trace and the access log
}

// candidates lists the healthy members serving model with ready endpoints.
func (g *generation) candidates(model string) ([]Candidate, []*member) {
	now := time.Now()
	var cands []Candidate
	var ms []*member
	for _, m := range g.members {
		v := m.evaluate(now, g.s)
		if !v.healthy {
			continue
		}
		load, ok := modelLoad(v.summary, model)
		if !ok || load.ReadyEndpoints == 0 {
			continue
		}
		pol := m.policy.Load()
		cands = append(cands, Candidate{Name: m.cfg.Name, Region: pol.region, Price: pol.price, Weight: pol.weight, Ramp: v.ramp,
			TTFTP50: seconds(load.TTFTP50Seconds), TTFTP95: seconds(load.TTFTP95Seconds), Samples: load.TTFTSamples,
			WaitingPerEndpoint: load.Waiting / float64(load.ReadyEndpoints), SentPerEndpoint: float64(v.sent) / float64(load.ReadyEndpoints),
			RunningPerEndpoint: load.Running / float64(load.ReadyEndpoints), MeanDuration: seconds(load.MeanDurationSeconds),
			Full:         m.full(load.Model, load.Running/float64(load.ReadyEndpoints)),
			KVCacheUsage: load.KVCacheUsage,
			ErrorRate:    load.ErrorRate, Requests: load.Requests})
		ms = append(ms, m)
	}
	return cands, ms
}

// known says whether any member's last summary lists the model.
func (g *generation) known(model string) bool {
	now := time.Now()
	for _, m := range g.members {
		if _, ok := modelLoad(m.evaluate(now, g.s).summary, model); ok {
			return true
		}
	}
	return false
}

func (g *generation) sloFor(model, tenant string) time.Duration {
	if d, ok := g.tslo[tenant]; ok {
		return d
	}
	if d, ok := g.slo[model]; ok {
		return d
	}
	return g.s.defaultSLO
}

// forward tries the ranked members in turn until one answers and relays its
// answer, recording in st what the request used. A member is given up on — and
// the next one tried — when it cannot be reached, answers 5xx or 429 (tier 1
// refusing: every endpoint busy), or fails or is lost before the first byte
// of its answer; never once a byte went to the client. The loop and the relay
// are proxy.Forward's; what is tier 2's — member health, failover and spill
// metrics, the first-byte watch, the settlement — is reached through its
// hooks.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, g *generation, rid, model string, body []byte, order []int, members []*member, cands []Candidate, start time.Time, st *settlement) {
	s := g.s
	member := func(k int) *member { return members[order[k]] }
	targets := make([]proxy.Target, len(order))
	for k := range order {
		targets[k] = proxy.Target{Name: member(k).cfg.Name, URL: member(k).base}
	}
	var header http.Header
	if st.objective != "" {
		header = http.Header{proxy.ObjectiveHeader: {st.objective}}
	}
	// A member lost while this request waits for its first byte (a hung
	// cluster), or a stream whose first token takes longer than
	// routing.firstByteTimeout, is given up on.
	timeout := time.Duration(0)
	if st.stream {
		timeout = s.firstByteTimeout
	}
	status := 0 // of the answer relayed
	tr := r.traceOf(req.Context())
	first := ""
	if len(targets) > 0 {
		first = targets[0].Name
	}
	ranked(tr, model, st.tenant, len(cands), first)
	res := proxy.Forward(w, &proxy.Job{
		Targets: targets, Transport: r.opts.Transport, Body: proxy.WholeBody(body), Request: req, RequestID: rid,
		// The client's credentials stay here whether or not this router
		// authenticates: a member is reached with none of them.
		Policy: proxy.HeaderPolicy{Tier: proxy.Tier2, StripCredentials: true}, Header: header,
		RetryStatus: func(code int) bool { return code >= 500 || code == http.StatusTooManyRequests },
		// The first bytes come before the headers go out: a member that dies
		// before them is still retried elsewhere.
		WaitFirstByte:    true,
		MidStreamMessage: "the member failed mid-response",
		IdleTimeout:      g.s.streamIdle,
		Acquire: func(k int) (func(), bool) {
			m := member(k)
			if m.base == nil {
				return nil, false // an unusable URL (the configuration's check let it through)
			}
			if k > 0 {
				r.m.Failovers.WithLabelValues(member(k-1).cfg.Name, m.cfg.Name).Inc()
			}
			if k == 0 && !s.priceBlind {
				if c := cheapest(cands); cands[order[0]].Price > cands[c].Price {
					r.m.Spills.WithLabelValues(model, cands[c].Name, m.cfg.Name).Inc()
				}
			}
			m.inFlight.Add(1)
			m.sent.Add(1)
			return func() { m.inFlight.Add(-1) }, true
		},
		Watch: func(ctx context.Context, k int, giveUp func(error)) {
			go r.watch(ctx, member(k), s.heartbeat, timeout, giveUp)
		},
		OnFailure: func(k int, err *proxy.AttemptError) {
			tr.Failed(k, err.Status, failedReason(err), err)
			m := member(k)
			if err.Status != 0 {
				if err.Status >= 500 {
					m.failed(time.Now(), false, r.health())
					r.observe(m)
				}
				r.log.Warn("member refused or failed; trying the next", "request_id", rid, "member", m.cfg.Name, "status", err.Status)
				return
			}
			// A slow member is not a dead one: a timeout counts toward ejection
			// as a server error does; anything else ejects at once.
			m.failed(time.Now(), !errors.Is(err, firstByteTimeout(timeout)), r.health())
			r.observe(m)
			r.log.Warn("member failed before answering; trying the next", "request_id", rid, "member", m.cfg.Name, "err", err.Err)
		},
		OnCommit: func(k, code int, h http.Header) {
			m := member(k)
			status = code
			if code >= 500 {
				// The last attempt's server error is relayed, and still counts
				// against the member.
				m.failed(time.Now(), false, r.health())
				r.observe(m)
			} else {
				m.succeeded()
			}
			for name := range h {
				if strings.HasPrefix(name, "X-Kvgate-") { // tier 1's internals (endpoint, scores) stay inside
					delete(h, name)
				}
			}
			h.Set("X-Kvgate-Member", m.cfg.Name)
		},
		OnFirstByte: func(k int, _ bool) {
			tr.FirstByte(k)
			// An error answer, relayed at its headers, has no first token.
			if status < 500 && status != http.StatusTooManyRequests {
				r.m.TTFT.WithLabelValues(member(k).cfg.Name).Observe(time.Since(start).Seconds())
			}
		},
		OnAttempt: attempting(tr, targets),
	})
	served(tr, targets, &res)
	if !res.Committed {
		ref := res.Unserved("no member answered in time; retry later",
			// Worth a retry soon, as tier 1's 503 for a pool it cannot serve.
			&proxy.Refusal{Status: http.StatusBadGateway, Type: openai.TypeServer, Message: "no member could serve the request; retry later", RetryAfter: 1})
		if ref == nil {
			name := ""
			if res.Target >= 0 {
				name = member(res.Target).cfg.Name
			}
			r.m.Requests.WithLabelValues(name, model, proxy.CodeClientGone).Inc()
			return
		}
		if res.Err != nil {
			r.log.Warn("no member could serve the request", "request_id", rid, "model", model, "err", res.Err)
		}
		r.refusal(w, model, ref)
		return
	}
	st.served = true
	m := member(res.Target)
	r.m.Requests.WithLabelValues(m.cfg.Name, model, res.Code).Inc()
	r.settle(m, cands[order[res.Target]].Price, start, res, st)
	if res.Abort {
		// The settlement is done; the connection is cut so that the client
		// cannot take a truncated body for a whole one.
		panic(http.ErrAbortHandler)
	}
}

// settle records in st, and in the metrics, the tokens an answer used: the
// usage the member reported, else the prompt estimate plus one token per
// streamed event; an error answer generated nothing. price is the member's
// when it was picked, at which the request is costed.
func (r *Router) settle(m *member, price float64, start time.Time, res proxy.Result, st *settlement) {
	prompt, completion := res.Usage.Prompt, res.Usage.Completion
	switch {
	case res.Usage.Seen:
	case res.Status >= 400:
		prompt, completion = 0, 0
	default:
		prompt, completion = st.prompt, res.Usage.Events
	}
	st.used = prompt + completion
	r.m.Tokens.WithLabelValues(m.cfg.Name, "prompt").Add(float64(prompt))
	r.m.Tokens.WithLabelValues(m.cfg.Name, "completion").Add(float64(completion))
	r.m.Cost.WithLabelValues(m.cfg.Name).Add(float64(st.used) * price / 1e6)
	r.m.Duration.WithLabelValues(m.cfg.Name).Observe(time.Since(start).Seconds())
}

// errMemberLost gives up on a member whose heartbeat went stale while a
// request waited for its first byte.
var errMemberLost = errors.New("lost (heartbeat gone) before answering")

// firstByteTimeout gives up on a member that kept a stream waiting d for its
// first event. It is a proxy.ErrTimeout, so a request only slow members
// failed is answered 504, and names its bound, as tier 1's does.
func firstByteTimeout(d time.Duration) proxy.Timeout {
	return proxy.Timeout(fmt.Sprintf("no first event within %v (firstByteTimeout)", d))
}

// watch calls giveUp when the member's heartbeat goes stale, or timeout (when
// not 0) passes, before ctx ends (the answer came). An ejected member whose
// heartbeat still answers is not given up on: ejection is about new requests,
// and a member ejected for being slow would otherwise lose the requests it is
// about to answer.
func (r *Router) watch(ctx context.Context, m *member, heartbeat, timeout time.Duration, giveUp func(error)) {
	t := time.NewTicker(max(10*time.Millisecond, heartbeat/2))
	defer t.Stop()
	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expired:
			giveUp(firstByteTimeout(timeout))
			return
		case <-t.C:
			// A draining member finishes what it holds; only a lost one is
			// given up on.
			if !m.evaluate(time.Now(), r.health()).fresh {
				giveUp(errMemberLost)
				return
			}
		}
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func cheapest(cands []Candidate) int {
	best := 0
	for i, c := range cands {
		if c.Price < cands[best].Price {
			best = i
		}
	}
	return best
}

func (r *Router) refusal(w http.ResponseWriter, model string, ref *proxy.Refusal) {
	r.m.Requests.WithLabelValues("", model, strconv.Itoa(ref.Status)).Inc()
	ref.Write(w)
}

// serveModels lists the models the healthy members serve.
func (r *Router) serveModels(w http.ResponseWriter, g *generation) {
	seen := map[string]bool{}
	var data []openai.Model
	now := time.Now()
	for _, m := range g.members {
		v := m.evaluate(now, g.s)
		if !v.healthy {
			continue
		}
		for _, ms := range v.summary.Models {
			for _, name := range append([]string{ms.Model}, ms.Adapters...) {
				if !seen[name] {
					seen[name] = true
					data = append(data, openai.Model{ID: name, Object: "model", OwnedBy: "kvgate"})
				}
			}
		}
	}
	slices.SortFunc(data, func(a, b openai.Model) int { return strings.Compare(a.ID, b.ID) })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(openai.Models(data))
}
