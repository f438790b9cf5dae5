package report

import (
	"cmp"
	"slices"
)

// DrawsDefinition says, for reports, how a policy run in several draws is shown.
const DrawsDefinition = "A policy run in several draws (a randomised one, such as kube-proxy, whose connections draw their pods) " +
	"is shown as the median over its draws, each figure's own median, nearest-rank like every percentile here (with an " +
	"even number of draws, the lower middle one), with the range over the draws (min–max) in brackets. Draws whose " +
	"queue never drained are left out of the median, counted, and shown apart on a row of their own; the plots draw " +
	"the draw of median P95 TTFT."

// row is what a table shows for one policy of a scenario: its result, or, for
// a policy run in several draws, the median over the draws whose queue drained
// (all of them, flagged unstable, when none did), with their range.
type row struct {
	Result           // the figures shown; Records and Drain are those of plotted
	draws   []Result // every draw, in the order run
	pool    []Result // the draws the figures are taken over
	lo, hi  Result   // per-figure minimum and maximum over pool
	plotted Result   // the draw of median P95 TTFT in pool
}

// drawn says whether the policy ran in several draws.
func (r row) drawn() bool { return len(r.draws) > 1 }

// undrained are the draws left out of the median because their queue never
// drained; none when every draw was unstable (the row itself then is).
func (r row) undrained() []Result {
	if len(r.pool) == len(r.draws) {
		return nil
	}
	var out []Result
	for _, d := range r.draws {
		if d.Unstable {
			out = append(out, d)
		}
	}
	return out
}

// figures are the per-policy numbers a row takes the median of.
var figures = []func(*Result) *float64{
	func(r *Result) *float64 { return &r.TTFTP50ms },
	func(r *Result) *float64 { return &r.TTFTP95ms },
	func(r *Result) *float64 { return &r.TTFTP99ms },
	func(r *Result) *float64 { return &r.ITLP50ms },
	func(r *Result) *float64 { return &r.ITLP95ms },
	func(r *Result) *float64 { return &r.E2EP95ms },
	func(r *Result) *float64 { return &r.OutputTokensPerS },
	func(r *Result) *float64 { return &r.PrefixHitRate },
	func(r *Result) *float64 { return &r.DurationS },
}

// newRow aggregates one policy's draws (at least one).
func newRow(draws []Result) row {
	r := row{draws: draws}
	for _, d := range draws {
		if !d.Unstable {
			r.pool = append(r.pool, d)
		}
	}
	if len(r.pool) == 0 {
		r.pool = draws
	}
	byP95 := slices.Clone(r.pool)
	slices.SortStableFunc(byP95, func(a, b Result) int { return cmp.Compare(a.TTFTP95ms, b.TTFTP95ms) })
	r.plotted = byP95[(len(byP95)+1)/2-1]
	if !r.drawn() {
		r.Result, r.lo, r.hi = draws[0], draws[0], draws[0]
		return r
	}
	r.Result = r.plotted
	r.Draw = 0
	r.Unstable = len(r.pool) == len(draws) && draws[0].Unstable
	r.lo, r.hi = r.Result, r.Result
	xs := make([]float64, len(r.pool))
	for _, f := range figures {
		for i := range r.pool {
			xs[i] = *f(&r.pool[i])
		}
		slices.Sort(xs)
		*f(&r.Result), *f(&r.lo), *f(&r.hi) = xs[(len(xs)+1)/2-1], xs[0], xs[len(xs)-1]
	}
	ints := make([]int, len(r.pool))
	for _, f := range []func(*Result) *int{func(r *Result) *int { return &r.Requests }, func(r *Result) *int { return &r.Errors },
		func(r *Result) *int { return &r.Preemptions }} {
		for i := range r.pool {
			ints[i] = *f(&r.pool[i])
		}
		slices.Sort(ints)
		*f(&r.Result), *f(&r.lo), *f(&r.hi) = ints[(len(ints)+1)/2-1], ints[0], ints[len(ints)-1]
	}
	return r
}

// rows groups the section's results by policy, in order of first appearance.
func (s section) rows() []row {
	var order []string
	by := map[string][]Result{}
	for _, r := range s.results {
		if _, ok := by[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		by[r.Policy] = append(by[r.Policy], r)
	}
	out := make([]row, len(order))
	for i, p := range order {
		out[i] = newRow(by[p])
	}
	return out
}

// row returns the row of policy, if it was run.
func (s section) row(policy string) (row, bool) {
	for _, r := range s.rows() {
		if r.Policy == policy {
			return r, true
		}
	}
	return row{}, false
}
