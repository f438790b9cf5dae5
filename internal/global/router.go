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
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/openai"
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
}

// Router is the global router's data plane.
type Router struct {
	cfg     *Config
	s       settings
	members []*member
	opts    Options
	log     *slog.Logger
	m       *Metrics
	slo     map[string]time.Duration // by model
	tslo    map[string]time.Duration // by tenant
	client  *http.Client             // heartbeats
	maxTok  int64

	draining bool
	mu       sync.Mutex
}

// New returns a router over cfg's members; Start runs their heartbeats.
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
	r := &Router{cfg: cfg, s: cfg.Spec.Routing.settings(), opts: opts, log: opts.Logger, m: opts.Metrics,
		slo: map[string]time.Duration{}, tslo: map[string]time.Duration{},
		client: &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, MaxIdleConnsPerHost: 4}},
		maxTok: 1024}
	for _, mc := range cfg.Spec.Members {
		r.members = append(r.members, newMember(mc))
	}
	for _, mp := range cfg.Spec.Models {
		if mp.TTFTSLO != nil {
			r.slo[mp.Name] = mp.TTFTSLO.Duration
		}
	}
	for _, t := range cfg.Spec.Tenants {
		if t.TTFTSLO != nil {
			r.tslo[t.Name] = t.TTFTSLO.Duration
		}
	}
	if rl := cfg.Spec.RateLimit; rl != nil && rl.DefaultMaxTokens != nil {
		r.maxTok = *rl.DefaultMaxTokens
	}
	return r
}

// Start runs the members' heartbeats until ctx ends.
func (r *Router) Start(ctx context.Context) {
	for _, m := range r.members {
		go m.poll(ctx, r.client, r.s, r.log, func() { r.observe(m) })
	}
}

// observe refreshes a member's gauges.
func (r *Router) observe(m *member) {
	v := m.evaluate(time.Now(), r.s)
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

// Routes served.
var proxied = map[string]bool{"/v1/completions": true, "/v1/chat/completions": true, "/v1/embeddings": true, "/v1/responses": true}

// ServeHTTP implements the OpenAI front door.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	rid := req.Header.Get("X-Request-Id")
	if rid == "" || len(rid) > 128 {
		var b [12]byte
		_, _ = rand.Read(b[:])
		rid = hex.EncodeToString(b[:])
	}
	w.Header().Set("X-Request-Id", rid)
	tenant := ""
	if r.opts.Auth != nil {
		id, err := r.opts.Auth.Authenticate(req)
		if err != nil {
			r.m.Requests.WithLabelValues("", "", "401").Inc()
			auth.WriteError(w, err)
			return
		}
		tenant = id.Tenant
	}
	switch {
	case req.URL.Path == "/v1/models" && req.Method == http.MethodGet:
		r.serveModels(w)
		return
	case !proxied[req.URL.Path]:
		r.refuse(w, "", http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("no route for %s %s", req.Method, req.URL.Path))
		return
	case req.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		r.refuse(w, "", http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method "+req.Method+" not allowed; use POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.s.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			r.refuse(w, "", http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return
		}
		r.refuse(w, "", http.StatusBadRequest, openai.TypeInvalidRequest, "reading request body: "+err.Error())
		return
	}
	var fields struct {
		Model               json.RawMessage `json:"model"`
		MaxTokens           *int64          `json:"max_tokens"`
		MaxCompletionTokens *int64          `json:"max_completion_tokens"`
		MaxOutputTokens     *int64          `json:"max_output_tokens"`
	}
	if err := json.Unmarshal(body, &fields); err != nil {
		r.refuse(w, "", http.StatusBadRequest, openai.TypeInvalidRequest, "malformed JSON body: "+err.Error())
		return
	}
	model := req.Header.Get("X-Gateway-Model-Name")
	if model == "" && len(fields.Model) > 0 && json.Unmarshal(fields.Model, &model) != nil {
		r.refuse(w, "", http.StatusBadRequest, openai.TypeInvalidRequest, "'model' must be a string")
		return
	}
	if model == "" {
		r.refuse(w, "", http.StatusBadRequest, openai.TypeInvalidRequest, "no model: set the model in the request body")
		return
	}
	// Tokens reserved up front: the prompt at about four bytes a token plus
	// the completion the request may ask for.
	completion := r.maxTok
	for _, v := range []*int64{fields.MaxTokens, fields.MaxCompletionTokens, fields.MaxOutputTokens} {
		if v != nil && *v > 0 {
			completion = *v
		}
	}
	estimate := int64(len(body))/4 + completion

	cands, members := r.candidates(model)
	if len(cands) == 0 {
		if !r.known(model) {
			// The model label stays empty: a client must not mint metric series.
			r.refuse(w, "", http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("no member serves model %q", model))
			return
		}
		w.Header().Set("Retry-After", "1")
		r.refuse(w, model, http.StatusServiceUnavailable, openai.TypeOverloaded, fmt.Sprintf("no healthy member serves model %q", model))
		return
	}
	var adm Admission
	if r.opts.Limiter != nil {
		adm, err = r.opts.Limiter.Admit(req.Context(), tenant, model, estimate)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			if req.Context().Err() != nil {
				r.m.Requests.WithLabelValues("", model, "499").Inc()
				return
			}
			r.log.Warn("rate limiting unavailable; refusing (rateLimit.failMode: closed)", "request_id", rid, "err", err)
			r.refuse(w, model, http.StatusServiceUnavailable, openai.TypeServer, "rate limiting is unavailable; retry later")
			return
		}
		for k, vs := range adm.Headers {
			w.Header()[k] = vs
		}
		if !adm.Allowed {
			if adm.TooLarge {
				r.refuse(w, model, http.StatusTooManyRequests, openai.TypeRateLimit,
					fmt.Sprintf("request too large: its %d estimated tokens exceed the tokens-per-minute limit of tenant %q on model %q; send less", estimate, tenant, model))
				return
			}
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int((adm.RetryAfter+time.Second-1)/time.Second))))
			r.refuse(w, model, http.StatusTooManyRequests, openai.TypeRateLimit, fmt.Sprintf("rate limit reached for tenant %q on model %q; retry later", tenant, model))
			return
		}
	}
	policy := Policy{SLO: r.sloFor(model, tenant), ClientRegion: req.Header.Get(r.s.regionHeader), CrossRegion: r.s.crossRegion,
		MaxErrorRate: r.s.maxErrorRate, PriceBlind: r.s.priceBlind}
	order := Rank(cands, policy, mrand.Float64)
	if len(order) > r.s.maxAttempts {
		order = order[:r.s.maxAttempts]
	}
	used, served := r.forward(w, req, rid, model, body, order, members, cands, start)
	// Settled after the client's request is done, on a fresh context so that a
	// client that went away still has its tokens counted. A request no member
	// served gives its reservation back whole.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), time.Second)
	defer cancel()
	switch {
	case served && adm.Reconcile != nil:
		adm.Reconcile(ctx, used)
	case !served && adm.Cancel != nil:
		adm.Cancel(ctx)
	}
}

// candidates lists the healthy members serving model with ready endpoints.
func (r *Router) candidates(model string) ([]Candidate, []*member) {
	now := time.Now()
	var cands []Candidate
	var ms []*member
	for _, m := range r.members {
		v := m.evaluate(now, r.s)
		if !v.healthy {
			continue
		}
		load, ok := modelLoad(v.summary, model)
		if !ok || load.ReadyEndpoints == 0 {
			continue
		}
		cands = append(cands, Candidate{Name: m.cfg.Name, Region: m.cfg.Region, Price: m.price, Weight: m.weight, Ramp: v.ramp,
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
func (r *Router) known(model string) bool {
	now := time.Now()
	for _, m := range r.members {
		if _, ok := modelLoad(m.evaluate(now, r.s).summary, model); ok {
			return true
		}
	}
	return false
}

func (r *Router) sloFor(model, tenant string) time.Duration {
	if d, ok := r.tslo[tenant]; ok {
		return d
	}
	if d, ok := r.slo[model]; ok {
		return d
	}
	return r.s.defaultSLO
}

// forward tries the ranked members in turn until one answers, relays its answer
// and returns the tokens the request used and whether a member served it.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, rid, model string, body []byte, order []int, members []*member, cands []Candidate, start time.Time) (int64, bool) {
	var lastErr error
	for k, i := range order {
		m := members[i]
		if k > 0 {
			r.m.Failovers.WithLabelValues(members[order[k-1]].cfg.Name, m.cfg.Name).Inc()
		}
		if c := cheapest(cands); k == 0 && cands[i].Price > cands[c].Price {
			r.m.Spills.WithLabelValues(model, cands[c].Name, m.cfg.Name).Inc()
		}
		out, err := r.upstream(req, m, rid, body)
		if err != nil {
			lastErr = err
			break
		}
		m.inFlight.Add(1)
		m.sent.Add(1)
		resp, err := r.opts.Transport.RoundTrip(out)
		if err != nil {
			m.inFlight.Add(-1)
			if req.Context().Err() != nil {
				r.m.Requests.WithLabelValues(m.cfg.Name, model, "499").Inc()
				return 0, false
			}
			m.failed(time.Now(), true, r.s)
			r.observe(m)
			r.log.Warn("member failed before answering; trying the next", "request_id", rid, "member", m.cfg.Name, "err", err)
			lastErr = fmt.Errorf("member %s: %w", m.cfg.Name, err)
			continue
		}
		if resp.StatusCode >= 500 && k < len(order)-1 {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			m.inFlight.Add(-1)
			m.failed(time.Now(), false, r.s)
			r.observe(m)
			r.log.Warn("member answered with a server error; trying the next", "request_id", rid, "member", m.cfg.Name, "status", resp.StatusCode)
			lastErr = fmt.Errorf("member %s answered %s", m.cfg.Name, resp.Status)
			continue
		}
		if resp.StatusCode >= 500 {
			// The last attempt's server error is relayed, and still counts
			// against the member.
			m.failed(time.Now(), false, r.s)
			r.observe(m)
		} else {
			m.succeeded()
		}
		used := r.relay(w, req, resp, m, model, start)
		m.inFlight.Add(-1)
		return used, true
	}
	msg := "no member could serve the request"
	if lastErr != nil {
		msg += ": " + lastErr.Error()
	}
	r.refuse(w, model, http.StatusBadGateway, openai.TypeServer, msg)
	return 0, false
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

// upstream builds the request to one member.
func (r *Router) upstream(req *http.Request, m *member, rid string, body []byte) (*http.Request, error) {
	u, err := url.Parse(strings.TrimSuffix(m.cfg.URL, "/") + req.URL.Path)
	if err != nil {
		return nil, fmt.Errorf("member %s URL: %w", m.cfg.Name, err)
	}
	u.RawQuery = req.URL.RawQuery
	out, err := http.NewRequestWithContext(req.Context(), http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range req.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Authorization", "Api-Key":
			// Hop-by-hop, and the client's credentials, which are this router's
			// business, not the member's.
			continue
		}
		out.Header[k] = vs
	}
	out.Header.Set("X-Request-Id", rid)
	if ip, _, err := net.SplitHostPort(req.RemoteAddr); err == nil {
		if prior := req.Header.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	return out, nil
}

// relay streams a member's answer to the client and returns the tokens used:
// the usage the member reported, else one token per streamed event (0 for a
// body without usage).
func (r *Router) relay(w http.ResponseWriter, req *http.Request, resp *http.Response, m *member, model string, start time.Time) int64 {
	defer func() { _ = resp.Body.Close() }()
	h := w.Header()
	for k, vs := range resp.Header {
		switch k {
		case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length":
			continue
		}
		h[k] = vs
	}
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	h.Set("X-Kvgate-Member", m.cfg.Name)
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	usage := gateway.NewUsageReader(sse)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	first, events := true, int64(0)
	code := strconv.Itoa(resp.StatusCode)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if first {
				first = false
				r.m.TTFT.WithLabelValues(m.cfg.Name).Observe(time.Since(start).Seconds())
			}
			usage.Feed(buf[:n])
			if sse {
				events += int64(bytes.Count(buf[:n], []byte("\ndata: "))) + int64(btoi(bytes.HasPrefix(buf[:n], []byte("data: "))))
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				code = "499"
				break
			}
			if sse {
				_ = rc.Flush()
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
			case req.Context().Err() != nil:
				code = "499" // the client went away; the member's request went with it
			case sse:
				code = "stream_error"
				ev, _ := json.Marshal(openai.ErrorBody{Error: openai.ErrorDetail{Message: "the member failed mid-response: " + err.Error(), Type: openai.TypeServer, Code: http.StatusBadGateway}})
				_, _ = fmt.Fprintf(w, "data: %s\n\n", ev)
				_ = rc.Flush()
			default:
				// Headers are out and the body is not a stream of events: cut the
				// connection so the client cannot take a truncated body for a
				// whole one.
				r.m.Requests.WithLabelValues(m.cfg.Name, model, "stream_error").Inc()
				panic(http.ErrAbortHandler)
			}
			break
		}
	}
	r.m.Requests.WithLabelValues(m.cfg.Name, model, code).Inc()
	r.m.Duration.WithLabelValues(m.cfg.Name).Observe(time.Since(start).Seconds())
	prompt, completion, ok := usage.Usage()
	if !ok {
		completion = events
	}
	used := prompt + completion
	r.m.Tokens.WithLabelValues(m.cfg.Name, "prompt").Add(float64(prompt))
	r.m.Tokens.WithLabelValues(m.cfg.Name, "completion").Add(float64(completion))
	r.m.Cost.WithLabelValues(m.cfg.Name).Add(float64(used) * m.price / 1e6)
	return used
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (r *Router) refuse(w http.ResponseWriter, model string, code int, typ, msg string) {
	r.m.Requests.WithLabelValues("", model, strconv.Itoa(code)).Inc()
	openai.WriteError(w, code, typ, msg)
}

// serveModels lists the models the healthy members serve.
func (r *Router) serveModels(w http.ResponseWriter) {
	seen := map[string]bool{}
	var data []openai.Model
	now := time.Now()
	for _, m := range r.members {
		v := m.evaluate(now, r.s)
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
