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
}

// Scorer scores every candidate in [0,1]; higher is better.
type Scorer interface {
	Name() string
	Score(req Request, eps []Endpoint) []float64
}

// minMaxLow scores values so that the lowest gets 1 and the highest 0; all equal
// gives every one 1.
func minMaxLow(vals []float64) []float64 {
	out := make([]float64, len(vals))
	if len(vals) == 0 {
		return out
	}
	lo, hi := slices.Min(vals), slices.Max(vals)
	for i, v := range vals {
		if hi == lo {
			out[i] = 1
		} else {
			out[i] = (hi - v) / (hi - lo)
		}
	}
	return out
}

// KVCache scores 1 − KV-cache usage.
type KVCache struct{}

var _ Scorer = KVCache{}

// Name implements Scorer.
func (KVCache) Name() string { return "kvCache" }

// Score implements Scorer.
func (KVCache) Score(_ Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	for i, e := range eps {
		out[i] = 1 - min(max(e.KVUsage, 0), 1)
	}
	return out
}

// Queue scores the waiting count, min-max normalised across the candidates.
type Queue struct{}

var _ Scorer = Queue{}

// Name implements Scorer.
func (Queue) Name() string { return "queue" }

// Score implements Scorer.
func (Queue) Score(_ Request, eps []Endpoint) []float64 {
	vals := make([]float64, len(eps))
	for i, e := range eps {
		vals[i] = e.Waiting
	}
	return minMaxLow(vals)
}

// RunningRequests scores the running batch size, min-max normalised.
type RunningRequests struct{}

var _ Scorer = RunningRequests{}

// Name implements Scorer.
func (RunningRequests) Name() string { return "runningRequests" }

// Score implements Scorer.
func (RunningRequests) Score(_ Request, eps []Endpoint) []float64 {
	vals := make([]float64, len(eps))
	for i, e := range eps {
		vals[i] = e.Running
	}
	return minMaxLow(vals)
}

// LoRAAffinity scores where a request's adapter is: resident (running) 1.0, a free
// slot to load it 0.8, queued for it 0.6, else 0. A base-model request scores 1
// everywhere.
type LoRAAffinity struct{}

var _ Scorer = LoRAAffinity{}

// Name implements Scorer.
func (LoRAAffinity) Name() string { return "loraAffinity" }

// Score implements Scorer.
func (LoRAAffinity) Score(req Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	for i, e := range eps {
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
	return out
}

// Prefix scores the share of the prompt's blocks the endpoint is believed to hold.
type Prefix struct{}

var _ Scorer = Prefix{}

// Name implements Scorer.
func (Prefix) Name() string { return "prefix" }

// Score implements Scorer.
func (Prefix) Score(_ Request, eps []Endpoint) []float64 {
	out := make([]float64, len(eps))
	for i, e := range eps {
		out[i] = min(max(e.PrefixMatch, 0), 1)
	}
	return out
}
