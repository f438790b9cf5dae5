package schedule

import (
	"fmt"
	"maps"
	"slices"
)

// Weights of the scorers, by scorer name.
type Weights map[string]float64

// GIEDefault are the weights of the Gateway API Inference Extension's default
// profile, which AWS's gateway documents too.
var GIEDefault = Weights{"queue": 2, "kvCache": 2, "prefix": 3}

// profiles are the built-in weights by name; docs/benchmarks.md says how the chat
// and batch weights were chosen.
var profiles = map[string]Weights{
	"gie-default": GIEDefault,
	"chat":        {"queue": 2, "kvCache": 2, "prefix": 3, "runningRequests": 1},
	"batch":       {"queue": 1, "kvCache": 3, "prefix": 3},
}

// DefaultProfile is the profile of a scheduler that names none.
const DefaultProfile = "chat"

// Profile returns a copy of the named profile's weights ("kvgate" is the default
// profile).
func Profile(name string) (Weights, error) {
	if name == "" || name == "kvgate" {
		name = DefaultProfile
	}
	w, ok := profiles[name]
	if !ok {
		return nil, fmt.Errorf("unknown profile %q", name)
	}
	return maps.Clone(w), nil
}

// Thresholds mark an endpoint saturated (the GIE defaults).
type Thresholds struct {
	Queue   float64 // waiting requests at or above this saturate; default 5
	KVUsage float64 // KV usage at or above this saturates; default 0.8
}

// Weighted is the GPU-aware picker: filters, then the weighted sum of the scorers,
// highest first, ties broken at random.
type Weighted struct {
	scorers    []Scorer
	weights    Weights
	thresholds Thresholds
	rng        *lockedRand
}

var _ Picker = (*Weighted)(nil)

// NewWeighted builds the picker; scorers with no weight are not run.
func NewWeighted(w Weights, t Thresholds, seed uint64) *Weighted {
	if t.Queue == 0 {
		t.Queue = 5
	}
	if t.KVUsage == 0 {
		t.KVUsage = 0.8
	}
	p := &Weighted{weights: w, thresholds: t, rng: newLockedRand(seed)}
	for _, s := range []Scorer{Queue{}, KVCache{}, Prefix{}, LoRAAffinity{}, RunningRequests{}} {
		if w[s.Name()] > 0 {
			p.scorers = append(p.scorers, s)
		}
	}
	return p
}

// Pick implements Picker.
func (p *Weighted) Pick(req Request, eps []Endpoint) Decision {
	cands := p.filter(req, eps)
	out := make([]Candidate, len(cands))
	for i, e := range cands {
		out[i] = Candidate{Address: e.Address, Scores: make(map[string]float64, len(p.scorers))}
	}
	for _, s := range p.scorers {
		w := p.weights[s.Name()]
		for i, v := range s.Score(req, cands) {
			out[i].Scores[s.Name()] = v
			out[i].Score += w * v
		}
	}
	p.rng.shuffle(out)
	slices.SortStableFunc(out, byScore)
	return Decision{Ranked: out}
}

// filter drops, in turn, unhealthy endpoints, stale ones, saturated ones and ones
// that cannot take the request's adapter — each step only when something is left,
// so the picker fails open rather than refusing.
func (p *Weighted) filter(req Request, eps []Endpoint) []Endpoint {
	keep := func(in []Endpoint, ok func(Endpoint) bool) []Endpoint {
		var out []Endpoint
		for _, e := range in {
			if ok(e) {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			return in
		}
		return out
	}
	eps = keep(eps, func(e Endpoint) bool { return e.Healthy })
	eps = keep(eps, func(e Endpoint) bool { return !e.Stale })
	eps = keep(eps, func(e Endpoint) bool {
		return e.Waiting < p.thresholds.Queue && e.KVUsage < p.thresholds.KVUsage
	})
	if req.Adapter != "" {
		eps = keep(eps, func(e Endpoint) bool {
			return !e.HasLoRA || slices.Contains(e.RunningAdapters, req.Adapter) || slices.Contains(e.WaitingAdapters, req.Adapter) ||
				len(e.RunningAdapters)+len(e.WaitingAdapters) < e.MaxLoRA
		})
	}
	return eps
}
