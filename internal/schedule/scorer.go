package schedule

import (
	"math"
	"slices"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/latency"
)

// Signals are what the GPU-aware scorers read of an endpoint: its scraped engine
// metrics (with the gateway's own dispatches folded in) and its prefix-cache
// affinity for the request.
type Signals struct {
	engine.Metrics
	HasMetrics bool
	Healthy    bool
	Stale      bool
	// PrefixMatch is the share of the request's prompt blocks the endpoint is
	// believed to hold, 0..1.
	PrefixMatch float64
	// PrefillTokens are prompt tokens this gateway sent to the endpoint that
	// await their first token: prefill work queued ahead of a new request.
	PrefillTokens float64
	// PrefillWork is the part of PrefillTokens not expected to be cached at
	// the endpoint: the prefill it has to compute.
	PrefillWork float64
	// ErrorRate is the share of the endpoint's recent answers that failed (5xx,
	// connection failures, timeouts, broken streams), 0..1, fading while it is
	// not tried: a pod that fails fast looks idle to its metrics.
	ErrorRate float64
	// Speed is what the gateway learned of the endpoint's speed from its
	// answers (latency.Tracker), or its pool's median while it has too few.
	Speed latency.Speed
	// Session says the endpoint served the request's session last
	// (sessionAffinity).
	Session bool
	// AdapterLoaded says the request's LoRA adapter is among the last
	// MaxLoRA distinct adapters this gateway sent there: loaded, even when
	// idle and so absent from the server's metrics. AdaptersHeld counts those
	// adapters, up to MaxLoRA.
	AdapterLoaded bool
	AdaptersHeld  int
}

// Scorer scores every candidate in [0,1], higher is better, into out (as long as
// eps).
type Scorer interface {
	Name() v1alpha1.ScorerName
	Score(req Request, eps []Endpoint, out []float64)
}

// Reader is a Scorer that reads signals a model server may not publish. A
// decision leaves such a scorer out when a candidate lacks one of them, and
// gives its weight to the scorers that see every candidate: a missing gauge
// reads 0, which would rate that server empty.
type Reader interface {
	Reads(req Request) engine.Signals
}

// minMaxLow rescales out in place so that the lowest value gets 1 and the highest
// 1 − (hi−lo)/max(hi−lo, spread): with spread 0, plain min-max (the highest gets
// 0); all equal gives every one 1.
func minMaxLow(out []float64, spread float64) {
	if len(out) == 0 {
		return
	}
	lo, hi := slices.Min(out), slices.Max(out)
	span := max(hi-lo, spread)
	for i, v := range out {
		if span == 0 {
			out[i] = 1
		} else {
			out[i] = 1 - (v-lo)/span
		}
	}
}

// KVCache scores 1 − KV-cache usage.
type KVCache struct{}

var _ Scorer = KVCache{}

// Name implements Scorer.
func (KVCache) Name() v1alpha1.ScorerName { return v1alpha1.ScorerKVCache }

// Reads implements Reader.
func (KVCache) Reads(Request) engine.Signals { return engine.SignalKVUsage }

// Score implements Scorer.
func (KVCache) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = 1 - min(max(eps[i].KVUsage, 0), 1)
	}
}

// Queue scores the waiting count, min-max normalised across the candidates, with
// a spread under which one request of difference does not swing the whole score.
type Queue struct{ Spread float64 }

var _ Scorer = Queue{}

// Name implements Scorer.
func (Queue) Name() v1alpha1.ScorerName { return v1alpha1.ScorerQueue }

// Reads implements Reader.
func (Queue) Reads(Request) engine.Signals { return engine.SignalQueue }

// Score implements Scorer.
func (q Queue) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = eps[i].Waiting
	}
	minMaxLow(out, q.Spread)
}

// RunningRequests scores the running batch size, min-max normalised like Queue.
type RunningRequests struct{ Spread float64 }

var _ Scorer = RunningRequests{}

// Name implements Scorer.
func (RunningRequests) Name() v1alpha1.ScorerName { return v1alpha1.ScorerRunningRequests }

// Reads implements Reader.
func (RunningRequests) Reads(Request) engine.Signals { return engine.SignalRunning }

// Score implements Scorer.
func (r RunningRequests) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = eps[i].Running
	}
	minMaxLow(out, r.Spread)
}

// LoRAAffinity scores where a request's adapter is: resident (running, or
// loaded by a recent request of this gateway) 1.0, a free slot to load it 0.8,
// queued for it 0.6, else 0. A base-model request scores 1 everywhere.
type LoRAAffinity struct{}

var _ Scorer = LoRAAffinity{}

// Name implements Scorer.
func (LoRAAffinity) Name() v1alpha1.ScorerName { return v1alpha1.ScorerLoRAAffinity }

// Reads implements Reader: only an adapter's request needs to know where
// adapters are.
func (LoRAAffinity) Reads(req Request) engine.Signals {
	if req.Adapter == "" {
		return 0
	}
	return engine.SignalLoRA
}

// Score implements Scorer.
func (LoRAAffinity) Score(req Request, eps []Endpoint, out []float64) {
	for i := range eps {
		e := &eps[i]
		out[i] = 0
		switch {
		case req.Adapter == "":
			out[i] = 1
		case e.AdapterLoaded || slices.Contains(e.RunningAdapters, req.Adapter):
			out[i] = 1
		case e.HasLoRA && max(len(e.RunningAdapters)+len(e.WaitingAdapters), e.AdaptersHeld) < e.MaxLoRA:
			out[i] = 0.8
		case slices.Contains(e.WaitingAdapters, req.Adapter):
			out[i] = 0.6
		}
	}
}

// Prefix scores the share of the prompt's blocks the endpoint is believed to hold.
type Prefix struct{}

var _ Scorer = Prefix{}

// Name implements Scorer.
func (Prefix) Name() v1alpha1.ScorerName { return v1alpha1.ScorerPrefix }

// Score implements Scorer.
func (Prefix) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = min(max(eps[i].PrefixMatch, 0), 1)
	}
}

// PrefillQueue scores the prompt tokens queued ahead at each endpoint by this
// gateway, min-max normalised with a spread: a count of waiting requests treats a
// 30-token prompt and an 8,000-token one alike, tokens do not.
type PrefillQueue struct{ Spread float64 }

var _ Scorer = PrefillQueue{}

// Name implements Scorer.
func (PrefillQueue) Name() v1alpha1.ScorerName { return v1alpha1.ScorerPrefillQueue }

// Score implements Scorer.
func (q PrefillQueue) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = eps[i].PrefillTokens
	}
	minMaxLow(out, q.Spread)
}

// ErrorRate scores the endpoints' recent failure shares min-max normalised with
// a spread: 25 points more than the best candidate's cost the whole weight (one
// failure in about 20 answers costs 40% of it). A
// pod that breaks a third of its streams frees its KV cache and queue early and
// would otherwise look the idlest; failures every pod shares (a prompt the model
// rejects) blame none.
type ErrorRate struct{ Spread float64 }

// ErrorRateSpread is the failure share that spans the errorRate scorer's range.
const ErrorRateSpread = 0.25

var _ Scorer = ErrorRate{}

// Name implements Scorer.
func (ErrorRate) Name() v1alpha1.ScorerName { return v1alpha1.ScorerErrorRate }

// Score implements Scorer.
func (r ErrorRate) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = min(max(eps[i].ErrorRate, 0), 1)
	}
	minMaxLow(out, r.Spread)
}

// PredictedLatency scores the time to first token the request can expect at
// each endpoint — its learned speed (Signals.Speed) applied to the prefill
// work ahead of it and its own uncached prompt, behind the running batch — as
// the best prediction over this one, with a tolerance (toleranceScore): twice
// the best's predicted wait scores 0.6. The gateway's own dispatches raise the
// work ahead between two scrapes, so a burst arriving at once spreads by
// speed, not evenly.
type PredictedLatency struct{}

var _ Scorer = PredictedLatency{}

// Name implements Scorer.
func (PredictedLatency) Name() v1alpha1.ScorerName { return v1alpha1.ScorerPredictedLatency }

// Score implements Scorer; out holds the predictions, seconds, until the last
// step.
func (PredictedLatency) Score(req Request, eps []Endpoint, out []float64) {
	best := math.Inf(1)
	for i := range eps {
		out[i] = PredictTTFT(req, &eps[i])
		best = min(best, out[i])
	}
	for i, v := range out {
		out[i] = toleranceScore(v, best)
	}
}

// minPrediction floors a prediction, seconds: a fully cached prompt on an idle
// pod predicts about nothing, and a ratio against 0 would score every other
// candidate alike.
const minPrediction = 1e-3

// PredictionTolerance is how far above the best prediction a candidate loses
// almost nothing (at most toleranceCost): a learned speed is an estimate, and
// on a pool of like pods the differences between predictions are mostly its
// noise. Past it, the score falls as best/prediction.
const PredictionTolerance = 0.25

// toleranceCost is what a candidate at the tolerance's edge loses: enough to
// rank predictions within it when nothing else differs.
const toleranceCost = 0.04

// toleranceScore scores a prediction v against the best one: 1 at the best,
// 1−toleranceCost at (1+PredictionTolerance)×best, then falling in proportion
// to best/v.
func toleranceScore(v, best float64) float64 {
	if math.IsInf(v, 1) {
		return 0
	}
	if v <= 0 || best <= 0 {
		return 1
	}
	if r := v/best - 1; r <= PredictionTolerance {
		return 1 - toleranceCost*r/PredictionTolerance
	}
	return (1 - toleranceCost) * (1 + PredictionTolerance) * best / v
}

// PredictTTFT is the time to first token, seconds, the request can expect at
// e by e's learned speed.
// A prediction that is not a number (nonsense in the inputs) is the worst.
func PredictTTFT(req Request, e *Endpoint) float64 {
	p := e.Speed.TTFT(req.PromptTokens*(1-min(max(e.PrefixMatch, 0), 1)), WorkAhead(e), e.Running, AdapterLoads(req, e))
	if math.IsNaN(p) {
		return math.Inf(1)
	}
	return max(p, minPrediction)
}

// AdapterLoads is 1 when the request's adapter would have to be loaded at e
// (e publishes its adapters and is not running this one), else 0.
func AdapterLoads(req Request, e *Endpoint) float64 {
	if req.Adapter == "" || !e.HasLoRA || e.AdapterLoaded || slices.Contains(e.RunningAdapters, req.Adapter) {
		return 0
	}
	return 1
}

// WorkAhead is the prefill work, in prompt tokens not expected to be cached,
// queued at e ahead of a new request: what this gateway sent that awaits its
// first token, or what the server reports waiting at the endpoint's typical
// prefill, whichever is more (other gateways' requests show only in the
// latter).
func WorkAhead(e *Endpoint) float64 {
	w := e.PrefillWork
	if e.Published().Has(engine.SignalQueue) {
		w = max(w, e.Waiting*e.Speed.MeanPrefillTokens)
	}
	return w
}

// SessionAffinity scores 1 for the endpoint that served the request's session
// last, while it carries no more than SessionLoadBound times its share of the
// candidates' requests in flight (consistent hashing with bounded loads): a
// session stays with the pod that holds its conversation's KV cache until
// that pod is unhealthy, saturated (both filtered out before scoring) or
// loaded beyond its share, and then moves.
type SessionAffinity struct{}

// SessionLoadBound is how far past its share of the in-flight requests a
// session's endpoint keeps the session.
const SessionLoadBound = 1.25

var _ Scorer = SessionAffinity{}

// Name implements Scorer.
func (SessionAffinity) Name() v1alpha1.ScorerName { return v1alpha1.ScorerSessionAffinity }

// Score implements Scorer.
func (SessionAffinity) Score(_ Request, eps []Endpoint, out []float64) {
	total := 0
	for i := range eps {
		total += eps[i].InFlight
	}
	bound := math.Ceil(SessionLoadBound * float64(total+1) / float64(len(eps)))
	for i := range eps {
		out[i] = 0
		if eps[i].Session && float64(eps[i].InFlight+1) <= bound {
			out[i] = 1
		}
	}
}
