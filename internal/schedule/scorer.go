package schedule

import (
	"slices"

	"github.com/kvgate/kvgate/internal/engine"
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
	// ErrorRate is the share of the endpoint's recent answers that failed (5xx,
	// connection failures, timeouts, broken streams), 0..1, fading while it is
	// not tried: a pod that fails fast looks idle to its metrics.
	ErrorRate float64
}

// Scorer scores every candidate in [0,1], higher is better, into out (as long as
// eps).
type Scorer interface {
	Name() string
	Score(req Request, eps []Endpoint, out []float64)
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
func (KVCache) Name() string { return "kvCache" }

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
func (Queue) Name() string { return "queue" }

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
func (RunningRequests) Name() string { return "runningRequests" }

// Score implements Scorer.
func (r RunningRequests) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = eps[i].Running
	}
	minMaxLow(out, r.Spread)
}

// LoRAAffinity scores where a request's adapter is: resident (running) 1.0, a free
// slot to load it 0.8, queued for it 0.6, else 0. A base-model request scores 1
// everywhere.
type LoRAAffinity struct{}

var _ Scorer = LoRAAffinity{}

// Name implements Scorer.
func (LoRAAffinity) Name() string { return "loraAffinity" }

// Score implements Scorer.
func (LoRAAffinity) Score(req Request, eps []Endpoint, out []float64) {
	for i := range eps {
		e := &eps[i]
		out[i] = 0
		switch {
		case req.Adapter == "":
			out[i] = 1
		case slices.Contains(e.RunningAdapters, req.Adapter):
			out[i] = 1
		case e.HasLoRA && len(e.RunningAdapters)+len(e.WaitingAdapters) < e.MaxLoRA:
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
func (Prefix) Name() string { return "prefix" }

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
func (PrefillQueue) Name() string { return "prefillQueue" }

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
func (ErrorRate) Name() string { return "errorRate" }

// Score implements Scorer.
func (r ErrorRate) Score(_ Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = min(max(eps[i].ErrorRate, 0), 1)
	}
	minMaxLow(out, r.Spread)
}
