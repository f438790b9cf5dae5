package route

import (
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/schedule"
)

// An endpoint whose learned speed is too slow (taught by a stall, or a noisy
// spell) gets no traffic, and so no answer that could correct the belief.
// Such an endpoint is probed: when it has been idle — healthy, fresh, nothing
// of this gateway's in flight there — and taught its speed nothing for
// probeAfter while its pool kept answering, one request is sent there, a
// cheap one when one comes, and its answer re-measures it. A pod wrongly
// believed slow is back within probeAfter and a few answers; a pod rightly
// slow (a small GPU its pool's faster pods keep idle at low load) pays a
// short request per probe, ever more rarely as its probes agree.

// probeAfter is how long an endpoint may go without teaching its speed
// anything, while its pool answers, before it is probed, and the least time
// between two probes of it. A stall that misleads the model lasts seconds;
// half a minute brings a misjudged pod back within a minute, at a request
// per endpoint every 30 s at most.
const probeAfter = 30 * time.Second

// probeBackoff bounds how many times probeAfter doubles for an endpoint whose
// probes keep confirming its speed: a rightly slow pod is probed after 30 s,
// then 60, 120 and every 240 s, until it takes traffic again.
const probeBackoff = 3

// probeContradicts is how many times faster than its endpoint's prediction a
// probe's answer must be to show the belief was wrong, not noisy: the model
// is then restarted from the pool's speed. Left to the robust fit, answers
// that far from the belief are taken for outliers, and the dozens needed to
// move it would take a probe each.
const probeContradicts = 4

// probeState is what an endpoint's probes go by, in unix nanoseconds of the
// router's clock.
type probeState struct {
	taughtAt atomic.Int64 // when an answer last taught its time to first token
	probedAt atomic.Int64 // when it was last probed
	agreed   atomic.Int32 // its probes in a row that confirmed its speed
}

// taught records that an answer taught e's time to first token at now; a
// probe's says whether it confirmed the speed.
func (e *endpoint) taught(now time.Time, probe, confirmed bool) {
	e.probe.taughtAt.Store(now.UnixNano())
	switch {
	case !probe || !confirmed:
		e.probe.agreed.Store(0)
	case e.probe.agreed.Load() < probeBackoff:
		e.probe.agreed.Add(1)
	}
}

// wait is how long e waits from its last answer or probe to its next probe.
func (e *endpoint) wait() int64 { return int64(probeAfter) << e.probe.agreed.Load() }

// probeTarget returns an endpoint of d's candidates due a probe, reserved
// under limit, for a request a may be sent to as one, or nil. It is called
// after the pick, with d.first reserved. The request is cheap for an
// endpoint when the endpoint's own speed predicts it no slower than a
// typical request on a typical pod of the pool (a probe of a pod rightly
// slow costs no more); past twice its wait, any request will do.
func (g *Router) probeTarget(p *scheduler, a decideArgs, req schedule.Request, d *decided, limit slots) *endpoint {
	// A request that must go where its session is, or meet an objective,
	// is not one to try a doubtful endpoint with.
	if !p.probes || a.session != "" && p.sessions != nil || a.slo > 0 || a.priority < 0 {
		return nil
	}
	now := g.now().UnixNano()
	if now-p.observedAt.Load() >= int64(probeAfter) {
		return nil // the pool is quiet: idle endpoints are missing nothing
	}
	pool := p.poolSpeed()
	typical := pool.TTFT(pool.MeanPrefillTokens, 0, 0, 0)
	var due *endpoint
	var dueAt int64
	for i := range d.cands {
		c := &d.cands[i]
		if c.Address == d.first.addr || !c.Healthy || c.Stale || c.Speed.Borrowed {
			continue
		}
		e := p.endpoint(c.Address)
		if e == nil || e.inFlight.Load() != 0 {
			continue
		}
		taught, wait := e.probe.taughtAt.Load(), e.wait()
		idle := now - max(taught, e.probe.probedAt.Load())
		// The prediction last: nearly every candidate is out before it.
		if taught == 0 || idle < wait || idle < 2*wait && schedule.PredictTTFT(req, c) > typical {
			continue
		}
		if due == nil || taught < dueAt {
			due, dueAt = e, taught
		}
	}
	if due == nil {
		return nil
	}
	// Concurrent picks claim the probe once.
	if last := due.probe.probedAt.Load(); now-last < int64(probeAfter) || !due.probe.probedAt.CompareAndSwap(last, now) {
		return nil
	}
	if !due.tryAcquire(limit) {
		return nil
	}
	return due
}

// relearn, for a probe's answer of ttft seconds, restarts the served
// endpoint's time-to-first-token model from its pool's when the answer is
// probeContradicts times faster than the model predicted: the belief that
// kept the endpoint idle was wrong. The answer then teaches the new model as
// any answer would, and the endpoint borrows its pool's speed, taking its
// share of requests, until its own answers make a model of it again. It
// reports whether the answer confirmed the belief.
func (r *Route) relearn(ttft float64) bool {
	predicted := r.served.speed.Speed(r.p.poolSpeed()).TTFT(float64(r.own), r.ahead, r.running, r.loads)
	if ttft*probeContradicts < predicted {
		r.served.speed.ForgetTTFT()
		return false
	}
	return true
}
