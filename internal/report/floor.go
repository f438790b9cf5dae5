package report

import (
	"slices"
	"time"
)

// Floor is a scenario's idle-engine floor (FloorDefinition): the TTFT
// percentiles no routing policy can beat on its trace and fleet.
type Floor struct {
	P50ms float64 `json:"p50_ms"`
	P95ms float64 `json:"p95_ms"`
	P99ms float64 `json:"p99_ms"`
	// Cold* are the same without a prefix cache: what a request costs that no
	// policy placed next to its prefix (not a bound for caching-aware policies).
	ColdP50ms float64 `json:"cold_p50_ms"`
	ColdP95ms float64 `json:"cold_p95_ms"`
	ColdP99ms float64 `json:"cold_p99_ms"`
	// Requests is how many of the trace's requests some engine of the fleet can
	// serve; the others fail under every policy and have no floor.
	Requests int `json:"requests"`
	// CachedShare is the share of those requests' prompt tokens that the floor
	// found cached: blocks an earlier request computed.
	CachedShare float64 `json:"cached_share"`
}

// FloorDefinition says, for reports, what the idle-engine floor is.
const FloorDefinition = "The **idle-engine floor** is each request's TTFT alone on an idle engine of the fleet's fastest kind " +
	"for it: nothing queued, nothing else running. The trace is replayed on one engine of each kind, each request " +
	"submitted only when the one before has finished, with a prefix cache that never evicts and a LoRA slot for every " +
	"adapter: a request finds cached every block of its prompt that an earlier request computed, as on a fleet that " +
	"placed it perfectly and had room for everything, and loads its adapter only if no earlier request used it. The " +
	"floor's percentiles are those of these per-request times, over the requests some engine can serve. Every request's " +
	"TTFT under any policy is at least its own floor, so each percentile is at least the floor's (a cold engine per " +
	"request would not be a bound: a policy that keeps prefixes warm beats it). The figures without a prefix cache " +
	"beside it are what a request costs placed where its prefix is not."

// NewFloor summarizes per-request floors, with and without a prefix cache,
// of the requests that have one.
func NewFloor(warm, cold []time.Duration) Floor {
	p := func(ds []time.Duration) (p50, p95, p99 float64) {
		xs := make([]float64, len(ds))
		for i, d := range ds {
			xs[i] = ms(d)
		}
		slices.Sort(xs)
		return percentile(xs, 50), percentile(xs, 95), percentile(xs, 99)
	}
	f := Floor{Requests: len(warm)}
	f.P50ms, f.P95ms, f.P99ms = p(warm)
	f.ColdP50ms, f.ColdP95ms, f.ColdP99ms = p(cold)
	return f
}

// at returns the floor at percentile p (50, 95 or 99), and false for another.
func (f Floor) at(p int) (float64, bool) {
	switch p {
	case 50:
		return f.P50ms, true
	case 95:
		return f.P95ms, true
	case 99:
		return f.P99ms, true
	}
	return 0, false
}
