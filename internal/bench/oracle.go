package bench

import (
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
)

// oracle is the reference policy: at each arrival it reads every engine exactly
// as the fleet will run it — no scrape, no lag — and sends the request where
// its simulated time to first token is lowest. It looks at the request alone:
// later arrivals, which may slow its prefill a little by sharing steps, are
// not foreseen.
//
// When the fleet routes an arrival at time t, an engine in the middle of a step
// has already run that step (its Now() is the step's end, ≥ t): a request
// submitted at t waits for the step to end, in the run as in the trial.
// An idle engine is advanced to t, as Fleet.Run advances it. So the engine,
// submitted to and stepped until the request's first token, gives exactly the
// TTFT the request would see if nothing else arrived; prefix cache, LRU order,
// LoRA slots and queue are the engine's own.
type oracle struct {
	engines []*sim.Engine
	// step is each engine's shortest step: what the one that computes a
	// request's last prompt token takes at least.
	step  []time.Duration
	order []int
	bound []time.Duration
	load  []int
	// exhaustive, in tests, tries every engine to the end: no pruning.
	exhaustive bool
}

func newOracle(engines []*sim.Engine) *oracle {
	n := len(engines)
	o := &oracle{engines: engines, step: make([]time.Duration, n), order: make([]int, n), bound: make([]time.Duration, n), load: make([]int, n)}
	for i, e := range engines {
		o.step[i] = e.CostModel().StepTime(sim.StepWork{})
	}
	return o
}

const never = time.Duration(1<<63 - 1)

// pick returns the engine with the lowest simulated TTFT for a, ties to the
// least loaded, then the lowest index; -1 when no engine can hold the request.
//
// A bound spares trials: an engine's TTFT is at least what its step in
// progress still runs plus one more step, so engines are tried in order of
// that bound (then of queue, to find a good one first) and one whose bound
// reaches the best TTFT found is not tried. On a mixed fleet the slow servers'
// longer shortest step spares most of their trials.
func (o *oracle) pick(a sim.Arrival) int {
	for i, e := range o.engines {
		o.order[i] = i
		// An engine's clock is ahead of the arrival when its last step ends
		// after it, busy or not: the request's first step starts no earlier.
		o.bound[i] = o.step[i] + max(0, e.Now()-a.At)
		g := e.Gauges(false)
		o.load[i] = g.Waiting + g.Running
	}
	slices.SortFunc(o.order, func(x, y int) int {
		if o.bound[x] != o.bound[y] {
			if o.bound[x] < o.bound[y] {
				return -1
			}
			return 1
		}
		if o.load[x] != o.load[y] {
			return o.load[x] - o.load[y]
		}
		return x - y
	})
	best, bestTTFT := -1, never
	for _, i := range o.order {
		e := o.engines[i]
		if a.Req.PromptTokens+a.Req.OutputTokens > e.MaxModelLen() {
			continue
		}
		if !o.exhaustive && o.bound[i] >= bestTTFT {
			break
		}
		if t, ok := ttftIfSubmitted(e, a); ok && t < bestTTFT {
			best, bestTTFT = i, t
		}
	}
	return best
}

// ttftIfSubmitted is the TTFT a's request would get on e if submitted now and
// nothing else arrived (sim's FirstTokenIfSubmitted: the engine runs to the
// request's first token under a journal and is put back as it was); ok is
// false when the engine refuses the request.
func ttftIfSubmitted(e *sim.Engine, a sim.Arrival) (time.Duration, bool) {
	t, err := e.FirstTokenIfSubmitted(a.Req, a.At)
	return t, err == nil
}
