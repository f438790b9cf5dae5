package schedule

import (
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
)

// Weights of the scorers, by scorer name.
type Weights map[v1alpha1.ScorerName]float64

// Profile is a named set of weights with the spreads of the load scorers.
type Profile struct {
	Weights Weights
	// QueueSpread and RunningSpread are the smallest spread of waiting (running)
	// requests across candidates that spans the scorer's whole range; a smaller
	// spread moves the score by 1/spread a request. 0 is plain min-max, as GIE
	// scores, where one request of difference is worth the scorer's whole weight.
	QueueSpread, RunningSpread float64
	// PrefillSpread is the prefillQueue scorer's spread, in tokens.
	PrefillSpread float64
	// Affinity is the prefixAffinity filter's gate (llm-d's); the zero
	// value filters nothing.
	Affinity Affinity
	// SkipSaturation leaves out the saturation filter: a profile that
	// reproduces another router whose default has none.
	SkipSaturation bool
}

// Equal reports whether two profiles score alike (a missing weight is 0).
func (p Profile) Equal(o Profile) bool {
	if p.QueueSpread != o.QueueSpread || p.RunningSpread != o.RunningSpread || p.PrefillSpread != o.PrefillSpread ||
		p.Affinity != o.Affinity || p.SkipSaturation != o.SkipSaturation {
		return false
	}
	for k, v := range p.Weights {
		if o.Weights[k] != v {
			return false
		}
	}
	for k, v := range o.Weights {
		if p.Weights[k] != v {
			return false
		}
	}
	return true
}

// WithAdapters returns the profile for a pool that serves LoRA adapters: adapter
// residency is cache affinity too, so unless the profile weighs it, it weighs as
// much as the prefix and outweighs a request or two of queue difference.
func (p Profile) WithAdapters() Profile {
	if _, set := p.Weights[v1alpha1.ScorerLoRAAffinity]; !set {
		p.Weights = maps.Clone(p.Weights)
		p.Weights[v1alpha1.ScorerLoRAAffinity] = 3
	}
	return p
}

// SessionWeight is the sessionAffinity weight of a scheduler with session
// affinity whose profile sets none: the most a single scorer weighs in chat,
// so that a session stays unless its endpoint fills or loads past its share.
const SessionWeight = 6

// WithSessions returns the profile for a pool with session affinity.
func (p Profile) WithSessions() Profile {
	if _, set := p.Weights[v1alpha1.ScorerSessionAffinity]; !set {
		p.Weights = maps.Clone(p.Weights)
		p.Weights[v1alpha1.ScorerSessionAffinity] = SessionWeight
	}
	return p
}

// UsesPrefix says whether the profile weighs a scorer that reads the
// request's prefix affinity (ScorerSpec.Prefix).
func (p Profile) UsesPrefix() bool {
	for i := range scorers {
		if scorers[i].Prefix && p.Weights[scorers[i].Name] > 0 {
			return true
		}
	}
	return false
}

// Thresholds mark an endpoint saturated (the GIE defaults).
type Thresholds struct {
	Queue   float64 // waiting requests at or above this saturate; default 5
	KVUsage float64 // KV usage at or above this saturates; default 0.8
}

// Saturated reports whether every endpoint of eps is at a threshold (zero
// thresholds take the defaults), reading only the signals they all publish:
// dispatching more would only queue inside the model servers. None is
// saturated when eps is empty or publishes neither signal.
func (t Thresholds) Saturated(eps []Endpoint) bool {
	t = t.withDefaults()
	seen := commonSignals(eps)
	if len(eps) == 0 || !seen.Has(engine.SignalQueue) && !seen.Has(engine.SignalKVUsage) {
		return false
	}
	for i := range eps {
		e := &eps[i]
		if !(seen.Has(engine.SignalQueue) && e.Waiting >= t.Queue || seen.Has(engine.SignalKVUsage) && e.KVUsage >= t.KVUsage) {
			return false
		}
	}
	return true
}

func (t Thresholds) withDefaults() Thresholds {
	if t.Queue == 0 {
		t.Queue = 5
	}
	if t.KVUsage == 0 {
		t.KVUsage = 0.8
	}
	return t
}

// RankDepth is how many candidates Weighted ranks: the pick and its fallbacks.
// Ranking only the best few keeps a decision over a thousand endpoints linear.
const RankDepth = 8

// Weighted is the GPU-aware picker: filters, then the weighted sum of the scorers,
// highest first, ties broken at random.
type Weighted struct {
	scorers    []Scorer
	weights    []float64 // aligned with scorers
	slots      []int     // each scorer's index in Scores
	thresholds Thresholds
	affinity   Affinity
	// saturates: the saturation filter applies (Profile.SkipSaturation).
	saturates bool
	// failing, when the errorRate scorer runs, is the failure share above the
	// best candidate's that keeps an endpoint from counting as unsaturated.
	failing float64
	// predicts: the predictedLatency scorer runs, and the ranked candidates
	// carry its prediction (x-kvgate-explain).
	predicts bool
	// filterTimers (aligned with filters) and scoreTimers (with scorers) take
	// each plugin's time in a timed decision, one in timeOneIn; nil when the
	// picker is not timed.
	filterTimers, scoreTimers []func(time.Duration)
	timeOneIn                 uint64
	decisions                 atomic.Uint64
	rng                       *lockedRand
	scratch                   sync.Pool // *pickScratch
}

// pickScratch holds one decision's working memory.
type pickScratch struct {
	vals  [][]float64 // per scorer, per candidate
	ran   []bool      // per scorer: it ran in this decision
	total []float64
	keys  []uint64 // random tie-breakers
	top   []int
}

var _ Picker = (*Weighted)(nil)

// NewWeighted builds the picker; scorers with no weight are not run.
func NewWeighted(pr Profile, t Thresholds, seed uint64) *Weighted {
	t = t.withDefaults()
	w := pr.Weights
	p := &Weighted{thresholds: t, affinity: pr.Affinity, saturates: !pr.SkipSaturation, rng: newLockedRand(seed)}
	for i, s := range scorers {
		if w[s.Name] > 0 {
			p.scorers = append(p.scorers, s.New(pr))
			p.weights = append(p.weights, w[s.Name])
			p.slots = append(p.slots, i)
		}
	}
	if w[v1alpha1.ScorerErrorRate] > 0 {
		p.failing = ErrorRateSpread
	}
	p.predicts = w[v1alpha1.ScorerPredictedLatency] > 0
	return p
}

// The extension points a Timer is told of, named as the Gateway API Inference
// Extension names them in its plugin metrics.
const (
	PointFilter = "Filter"
	PointScorer = "Scorer"
)

// Timer times the weighted picker's plugins: given an extension point and a
// plugin's name, it returns the function a timed decision calls once with the
// time spent in that plugin, across all candidates.
type Timer func(point, plugin string) func(time.Duration)

// TimeOneIn is how many decisions the gateway times one of. Timing a plugin
// reads the clock and adds to a histogram, about 0.1 µs each on a virtual
// machine, against a decision of some 20 µs with ten plugins: timing every
// decision would add 5%, one in 8 under 1%, and a sample of decisions has
// their distribution.
const TimeOneIn = 8

// WithTimer has the picker time its filters and scorers in one decision of
// every oneIn (1: all); it asks t for their functions now, so that a decision
// only reads the clock. A nil t times nothing. Call it before the picker is
// used.
func (p *Weighted) WithTimer(t Timer, oneIn int) *Weighted {
	p.filterTimers, p.scoreTimers, p.timeOneIn = nil, nil, uint64(max(oneIn, 1))
	if t == nil {
		return p
	}
	for _, f := range filters {
		p.filterTimers = append(p.filterTimers, t(PointFilter, string(f.Name)))
	}
	for _, s := range p.scorers {
		p.scoreTimers = append(p.scoreTimers, t(PointScorer, string(s.Name())))
	}
	return p
}

// stopwatch times consecutive steps, reading the monotonic clock once a step.
type stopwatch struct {
	t0   time.Time
	last time.Duration
}

func (s *stopwatch) start() { s.t0 = time.Now() }

// lap returns the time since the previous lap (or the start).
func (s *stopwatch) lap() time.Duration {
	at := time.Since(s.t0)
	d := at - s.last
	s.last = at
	return d
}

// Pick implements Picker. It reorders eps (filtered-out endpoints move to the back).
func (p *Weighted) Pick(req Request, eps []Endpoint) Decision {
	// One stopwatch times the filters, then the scorers: a plugin costs a
	// single reading of the clock. The first decision is timed, then one in
	// timeOneIn; sw stays nil in the others.
	var w stopwatch
	var sw *stopwatch
	if p.filterTimers != nil && (p.timeOneIn == 1 || (p.decisions.Add(1)-1)%p.timeOneIn == 0) {
		w.start()
		sw = &w
	}
	cands := p.filter(req, eps, sw)
	n := len(cands)
	if n == 0 {
		return Decision{}
	}
	sc, _ := p.scratch.Get().(*pickScratch)
	if sc == nil {
		sc = &pickScratch{}
	}
	defer p.scratch.Put(sc)
	sc.total = resize(sc.total, n)
	clear(sc.total)
	for len(sc.vals) < len(p.scorers) {
		sc.vals = append(sc.vals, nil)
	}
	// A scorer reading a signal some candidate does not publish sits this
	// decision out, its weight shared by the others in proportion.
	seen := commonSignals(cands)
	sc.ran = resize(sc.ran, len(p.scorers))
	all, kept := 0.0, 0.0
	for k, s := range p.scorers {
		r, ok := s.(Reader)
		sc.ran[k] = !ok || seen.Has(r.Reads(req))
		all += p.weights[k]
		if sc.ran[k] {
			kept += p.weights[k]
		}
	}
	if sw != nil {
		sw.lap() // the decision's own work since the last filter is no plugin's
	}
	for k, s := range p.scorers {
		if !sc.ran[k] {
			continue
		}
		v := resize(sc.vals[k], n)
		sc.vals[k] = v
		s.Score(req, cands, v)
		if sw != nil {
			p.scoreTimers[k](sw.lap())
		}
	}
	for k := range p.scorers {
		if !sc.ran[k] {
			continue
		}
		w := p.weights[k] * all / kept
		for i, x := range sc.vals[k] {
			sc.total[i] += w * x
		}
	}
	sc.keys = resize(sc.keys, n)
	p.rng.fill(sc.keys)
	// The best RankDepth by (score, random key): insertion into a short sorted list.
	better := func(i, j int) bool {
		return sc.total[i] > sc.total[j] || sc.total[i] == sc.total[j] && sc.keys[i] < sc.keys[j]
	}
	top := sc.top[:0]
	for i := range n {
		if len(top) == RankDepth && !better(i, top[len(top)-1]) {
			continue
		}
		if len(top) < RankDepth {
			top = append(top, i)
		} else {
			top[len(top)-1] = i
		}
		for j := len(top) - 1; j > 0 && better(top[j], top[j-1]); j-- {
			top[j], top[j-1] = top[j-1], top[j]
		}
	}
	sc.top = top
	out := make([]Candidate, len(top))
	for r, i := range top {
		out[r] = Candidate{Address: cands[i].Address, Score: sc.total[i]}
		if p.predicts {
			out[r].PredictedTTFT = PredictTTFT(req, &cands[i])
		}
		for k := range p.scorers {
			if sc.ran[k] {
				out[r].Scores.put(p.slots[k], sc.vals[k][i])
			}
		}
	}
	return Decision{Ranked: out}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// filter applies the filters in turn (FilterSpec), timing each on sw unless
// it is nil. It partitions eps in place and returns the kept front.
func (p *Weighted) filter(req Request, eps []Endpoint, sw *stopwatch) []Endpoint {
	if len(eps) == 0 {
		return eps
	}
	for i := range filters {
		eps = filters[i].keep(p, req, eps)
		if sw != nil {
			p.filterTimers[i](sw.lap())
		}
	}
	return eps
}

// healthy keeps the endpoints whose scrapes succeed.
func (*Weighted) healthy(_ Request, eps []Endpoint) []Endpoint {
	return keep(eps, func(e *Endpoint) bool { return e.Healthy })
}

// fresh keeps the endpoints whose metrics are not stale.
func (*Weighted) fresh(_ Request, eps []Endpoint) []Endpoint {
	return keep(eps, func(e *Endpoint) bool { return !e.Stale })
}

// unsaturated keeps the endpoints under the queue and KV-cache thresholds, or
// holding much more of the prompt than those, and, when errorRate runs, not
// failing much more than the best.
func (p *Weighted) unsaturated(req Request, eps []Endpoint) []Endpoint {
	if !p.saturates {
		return eps
	}
	// A failing endpoint is no refuge from saturation: were it the only one
	// left unsaturated (its broken requests free it early), the filter would
	// hand it every request whatever its score.
	ceiling := math.Inf(1)
	if p.failing > 0 {
		lo := eps[0].ErrorRate
		for i := range eps {
			lo = min(lo, eps[i].ErrorRate)
		}
		ceiling = lo + p.failing
	}
	// A threshold on a signal some candidate does not publish is not applied:
	// a missing gauge reads 0, which would keep that server and no other.
	seen := commonSignals(eps)
	queueLimit, kvLimit := p.thresholds.Queue, p.thresholds.KVUsage
	if !seen.Has(engine.SignalQueue) {
		queueLimit = math.Inf(1)
	}
	if !seen.Has(engine.SignalKVUsage) {
		kvLimit = math.Inf(1)
	}
	roomy := func(e *Endpoint) bool { return e.KVUsage < kvLimit && e.ErrorRate < ceiling }
	// The queue depth stands for the wait; when predictedLatency runs, the
	// prediction is the better measure. An endpoint over the depth stays a
	// candidate while it is predicted to answer sooner than every one under
	// it: a fast server with five prompts queued starts a new one before a
	// slow server with four, and a burst is not herded onto the slow one.
	best := math.Inf(1)
	if p.predicts {
		for i := range eps {
			if e := &eps[i]; roomy(e) && e.Waiting < queueLimit {
				best = min(best, PredictTTFT(req, e))
			}
		}
	}
	// An endpoint that holds notably more of the prompt than every one under
	// the thresholds stays a candidate too: sending the request elsewhere
	// computes its prefix again, work a saturated fleet does not have, and
	// under load that spreads one tenant's prompts over every pod until no
	// pod's cache holds them.
	held := 0.0
	for i := range eps {
		if e := &eps[i]; roomy(e) && e.Waiting < queueLimit {
			held = max(held, e.PrefixMatch)
		}
	}
	return keep(eps, func(e *Endpoint) bool {
		if e.ErrorRate >= ceiling {
			return false
		}
		return e.PrefixMatch >= held+WarmMargin ||
			roomy(e) && (e.Waiting < queueLimit || !math.IsInf(best, 1) && PredictTTFT(req, e) < best)
	})
}

// WarmMargin is how much more of a prompt's blocks (a share, 0..1) a
// saturated endpoint must hold than every unsaturated one to stay a
// candidate for it.
const WarmMargin = 0.25

// adapterRoom keeps, for an adapter's request, the endpoints that run the
// adapter, have it queued, or have a free slot to load it.
func (*Weighted) adapterRoom(req Request, eps []Endpoint) []Endpoint {
	if req.Adapter == "" {
		return eps
	}
	return keep(eps, func(e *Endpoint) bool {
		return !e.HasLoRA || slices.Contains(e.RunningAdapters, req.Adapter) || slices.Contains(e.WaitingAdapters, req.Adapter) ||
			len(e.RunningAdapters)+len(e.WaitingAdapters) < e.MaxLoRA
	})
}

// keep moves the endpoints ok accepts to the front and returns them, or returns
// eps unchanged when it accepts none.
func keep(eps []Endpoint, ok func(*Endpoint) bool) []Endpoint {
	k := 0
	for i := range eps {
		if ok(&eps[i]) {
			if i != k {
				eps[k], eps[i] = eps[i], eps[k]
			}
			k++
		}
	}
	if k == 0 {
		return eps
	}
	return eps[:k]
}

// commonSignals are the signals every endpoint of eps publishes.
func commonSignals(eps []Endpoint) engine.Signals {
	seen := engine.AllSignals
	for i := range eps {
		seen &= eps[i].Published()
	}
	return seen
}
