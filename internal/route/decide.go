package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/schedule"
)

// hashPool holds prompt block-hash slices.
var hashPool = sync.Pool{New: func() any { s := make([]uint64, 0, prefix.DefaultMaxBlocks); return &s }}

// decideArgs are the inputs of one routing decision.
type decideArgs struct {
	rid    string
	p      *scheduler
	model  string
	prompt []byte // the raw head of the prompt, for prefix affinity
	// subset, when not nil, restricts the pick to these addresses (the Endpoint
	// Picker protocol's subset hint).
	subset []string
	limit  slots
	wait   time.Duration
	start  time.Time
	// priority orders waiting requests (spec.objectives); below 0 a request
	// is refused rather than wait.
	priority int32
	// promptTokens estimates the prompt's tokens (predictedLatency).
	promptTokens int
	// slo is the request's time-to-first-token objective, 0 for none.
	slo time.Duration
	// session is the request's session key, "" for none.
	session string
}

// decided is a pick: the ranked decision, the candidates as the picker saw them
// (they live in the scratch the decision was made with), the prompt's block
// hashes and the reserved first endpoint.
type decided struct {
	decision schedule.Decision
	cands    []schedule.Endpoint
	hashes   []uint64
	first    *endpoint
	// probe says first is an endpoint probed (probe.go), not the pick.
	probe bool
}

// decide hashes the prompt's head, waits for admission and picks, reserving the
// best endpoint, or returns the refusal.
func (g *Router) decide(ctx context.Context, a decideArgs, sc *snapshotScratch, hb *[]uint64) (decided, *proxy.Refusal) {
	p := a.p
	req := schedule.Request{Model: a.model, Adapter: adapterOf(p, a.model), PromptTokens: float64(a.promptTokens)}
	var d decided
	if pc := p.prefix; pc.blockChars > 0 && len(a.prompt) >= pc.blockChars {
		d.hashes = prefix.Hashes((*hb)[:0], a.prompt, pc.blockChars, pc.maxBlocks, pc.seeds[a.model])
		*hb = d.hashes
	}
	var ref *proxy.Refusal
	d.decision, d.cands, d.first, ref = g.choose(ctx, p, req, d.hashes, a, sc)
	if ref != nil {
		return d, ref
	}
	if ep := g.probeTarget(p, a, req, &d, a.limit); ep != nil {
		d.first.release()
		g.freed.signal()
		d.first, d.probe = ep, true
		g.m.Probes.WithLabelValues(p.name).Inc()
	}
	g.m.Decision.Observe(g.now().Sub(a.start).Seconds())
	g.keepDecision(p, a.rid, a.model, d)
	if n := g.decisions.Add(1); n%uint64(g.opts.DecisionLogEvery) == 0 && g.log.Enabled(ctx, slog.LevelDebug) {
		g.log.Debug("decision", "request_id", a.rid, "scheduler", p.name, "model", a.model, "chosen", d.first.addr,
			"candidates", explain(d.decision), "sampled_every", g.opts.DecisionLogEvery)
	}
	if p.prefix.blockChars > 0 {
		if i := slices.IndexFunc(d.cands, func(e schedule.Endpoint) bool { return e.Address == d.first.addr }); i >= 0 {
			g.m.PrefixMatch.WithLabelValues(p.name).Observe(d.cands[i].PrefixMatch)
		}
	}
	return d, nil
}

// choose waits, up to a.wait, for an endpoint of p below a.limit, ranks the
// candidates and reserves the best one it can. It returns the decision and the
// reserved endpoint, or the refusal, counted as shed for its reason.
func (g *Router) choose(ctx context.Context, p *scheduler, req schedule.Request, hashes []uint64, a decideArgs, sc *snapshotScratch) (schedule.Decision, []schedule.Endpoint, *endpoint, *proxy.Refusal) {
	none := schedule.Decision{}
	limit := a.limit
	if len(p.endpoints) == 0 {
		return none, nil, nil, g.shed(p, "no_endpoint", http.StatusServiceUnavailable, fmt.Sprintf("no ready endpoint for model %q", p.spec.ModelName))
	}
	if a.subset != nil && !slices.ContainsFunc(p.endpoints, func(e *endpoint) bool { return slices.Contains(a.subset, e.addr) }) {
		return none, nil, nil, g.shed(p, "no_endpoint", http.StatusServiceUnavailable, fmt.Sprintf("no endpoint of model %q is in the proxy's subset hint", p.spec.ModelName))
	}
	var timer *time.Timer
	expired, sloChecked := false, false
	// A request registers as waiting, for the endpoints it could use, once it
	// has to wait — or at once when others already wait, so that a freed slot
	// it is more important for is not taken by one woken meanwhile. Sheddable
	// requests never wait.
	var usable []*endpoint
	registered := false
	sessionAddr := ""
	if p.sessions != nil {
		sessionAddr = p.sessions.get(a.session, g.now())
	}
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
		all := p.snapshot(g.fleet, g.prefix, hashes, req.Adapter, limit, a.subset, sessionAddr, g.now(), sc)
		for _, addr := range sc.recovered {
			g.log.Info("endpoint back after an outage: its ejection and failures are forgotten", "scheduler", p.name, "endpoint", addr)
		}
		// Past saturation, more work only queues inside the engines, where
		// it delays the requests that matter: sheddable work goes first.
		if a.priority < 0 && p.saturation.Saturated(all) {
			return none, nil, nil, g.shed(p, "sheddable", http.StatusTooManyRequests, fmt.Sprintf("every endpoint of model %q is saturated and the request's objective is sheddable; retry later", p.spec.ModelName))
		}
		if cands := g.waiting.usable(p, all, a.priority); len(cands) > 0 {
			if a.slo > 0 && !sloChecked {
				sloChecked = true
				if !p.meets(req, cands, a.slo, g.now()) {
					if a.priority < 0 {
						g.m.SLOMisses.WithLabelValues(p.name, "shed").Inc()
						return none, nil, nil, g.shed(p, "slo", http.StatusTooManyRequests,
							fmt.Sprintf("no endpoint of model %q is predicted to answer within the request's time-to-first-token objective of %v, and the request is sheddable; retry later", p.spec.ModelName, a.slo))
					}
					g.m.SLOMisses.WithLabelValues(p.name, "routed").Inc()
				}
			}
			d := p.picker.Pick(req, cands)
			for _, c := range d.Ranked {
				if ep := p.endpoint(c.Address); ep != nil && ep.tryAcquire(limit) {
					return d, cands, ep, nil
				}
			}
		}
		// Every endpoint known down (none merely full): waiting for a slot
		// or sending it to a frozen pod would only end in a timeout.
		if len(all) == 0 && sc.full == 0 && sc.down > 0 {
			return none, nil, nil, g.shed(p, "no_endpoint", http.StatusServiceUnavailable, fmt.Sprintf("no ready endpoint for model %q", p.spec.ModelName))
		}
		if a.priority < 0 {
			return none, nil, nil, g.shed(p, "sheddable", http.StatusTooManyRequests, fmt.Sprintf("every endpoint of model %q is busy and the request's objective is sheddable; retry later", p.spec.ModelName))
		}
		if expired {
			return none, nil, nil, g.shed(p, "saturated", http.StatusTooManyRequests, limit.refusal(p.spec.ModelName))
		}
		if timer == nil {
			timer = time.NewTimer(a.wait)
			defer timer.Stop()
		}
		register()
		// An endpoint that may borrow a slot once its window ends wakes no
		// one when it does: look again then.
		var soon <-chan time.Time
		if sc.soon {
			soon = time.After(borrowPoll)
		}
		select {
		case <-woken:
		case <-soon:
		case <-timer.C:
			expired = true // one last look before refusing
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return none, nil, nil, overloaded(proxy.StatusClientClosed, "the client went away while waiting for an endpoint")
			}
			return none, nil, nil, overloaded(http.StatusGatewayTimeout, "route timeout exceeded while waiting for an endpoint")
		}
	}
}

// shed counts a refusal of p's admission for reason and returns it.
func (g *Router) shed(p *scheduler, reason string, status int, msg string) *proxy.Refusal {
	g.m.Shed.WithLabelValues(p.name, reason).Inc()
	return overloaded(status, msg)
}

// overloaded is the refusal of a request admission could not place: worth
// another try soon when the pool is busy or empty, not when the request's
// own time ran out or its client left.
func overloaded(status int, msg string) *proxy.Refusal {
	ref := &proxy.Refusal{Status: status, Type: openai.TypeOverloaded, Message: msg}
	if status != http.StatusGatewayTimeout && status != proxy.StatusClientClosed {
		ref.RetryAfter = 1
	}
	return ref
}

// sloFresh is how recent the pool's last lesson about its speed must be for a
// prediction to shed a request: with none since, the pool may have changed
// (and shedding everything would keep it from showing it), so requests are
// let through.
const sloFresh = 10 * time.Second

// meets says whether some candidate the picker would use (healthy and fresh,
// when any is) is predicted to give the request its first token within slo.
// Before an endpoint of the pool has learned its speed, or when the last
// answer that taught one is older than sloFresh, the request is let through.
func (p *scheduler) meets(req schedule.Request, cands []schedule.Endpoint, slo time.Duration, now time.Time) bool {
	if s := p.prior.Load(); s == nil || s.Samples == 0 || now.UnixNano()-p.observedAt.Load() > int64(sloFresh) {
		return true
	}
	usable := slices.ContainsFunc(cands, func(e schedule.Endpoint) bool { return e.Healthy && !e.Stale })
	for i := range cands {
		if usable && (!cands[i].Healthy || cands[i].Stale) {
			continue
		}
		if schedule.PredictTTFT(req, &cands[i]) <= slo.Seconds() {
			return true
		}
	}
	return false
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
		if c.PredictedTTFT > 0 {
			fmt.Fprintf(&b, " predictedTTFT=%.3fs", c.PredictedTTFT)
		}
	}
	return b.String()
}
