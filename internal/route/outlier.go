package route

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// outlier is an endpoint's passive health, learned from its answers as
// Envoy's outlier detection learns it: failures in a row, and the ejection they
// led to. It lives on the endpoint, so it outlives reloads.
type outlier struct {
	until    atomic.Int64 // when the ejection ends, in Unix nanoseconds; 0: never ejected
	failures atomic.Int32 // in a row
	mu       sync.Mutex
	count    int // ejections so far, lengthening the next
	// The recent failure share: an exponentially weighted mean of the answers
	// (1 failed, 0 not) that fades while no answer comes, read without a lock.
	rate   atomic.Uint64 // float64 bits
	rateAt atomic.Int64  // Unix nanoseconds of its last update
	// wasDown: the fleet found the endpoint gone or frozen since it was last
	// seen healthy; its next healthy scrape ends the outage (recovered).
	wasDown atomic.Bool
}

const (
	// errorRateWeight is how much one answer moves the failure share: about
	// the last 20 answers count.
	errorRateWeight = 0.1
	// errorRateHalfLife fades the share of an endpoint no longer tried, so it
	// is tried again.
	errorRateHalfLife = 10 * time.Second
)

// errorRate is the endpoint's recent failure share at now, 0..1.
func (e *endpoint) errorRate(now time.Time) float64 {
	r := math.Float64frombits(e.out.rate.Load())
	if r == 0 {
		return 0
	}
	if dt := now.UnixNano() - e.out.rateAt.Load(); dt > 0 {
		r *= math.Exp2(-float64(dt) / float64(errorRateHalfLife))
	}
	return r
}

// noteAnswer moves the failure share by one answer.
func (e *endpoint) noteAnswer(now time.Time, failed bool) {
	if !failed && e.out.rate.Load() == 0 {
		return // the common case: nothing to fade, no lock
	}
	e.out.mu.Lock()
	defer e.out.mu.Unlock()
	r := e.errorRate(now)
	x := 0.0
	if failed {
		x = 1
	}
	r += errorRateWeight * (x - r)
	if r < 1e-3 {
		r = 0
	}
	e.out.rate.Store(math.Float64bits(r))
	e.out.rateAt.Store(now.UnixNano())
}

// ejected says whether the endpoint is ejected at now.
func (e *endpoint) ejected(now time.Time) bool {
	u := e.out.until.Load()
	return u != 0 && now.UnixNano() < u
}

// sawDown notes that the fleet found e gone or frozen.
func (e *endpoint) sawDown() {
	if !e.out.wasDown.Load() {
		e.out.wasDown.Store(true)
	}
}

// recovered ends an outage of e once the fleet scrapes it healthy and fresh
// again (as Envoy un-ejects a host on a passing health check): its ejection
// ends and its failures are forgotten, for they were the outage's (streams cut
// by a kill, before any scrape could tell). It says whether it did.
func (e *endpoint) recovered(s *fleet.Snapshot, now time.Time) bool {
	if !e.out.wasDown.Load() || !s.Healthy || s.Stale || s.Failures != 0 {
		return false
	}
	e.out.mu.Lock()
	defer e.out.mu.Unlock()
	if !e.out.wasDown.Load() {
		return false // another pick got here first
	}
	e.out.wasDown.Store(false)
	if e.ejected(now) {
		e.out.until.Store(now.UnixNano())
	}
	e.out.failures.Store(0)
	e.out.rate.Store(0)
	e.out.rateAt.Store(now.UnixNano())
	return true
}

// outlierPolicy is a scheduler's outlier detection (spec.gateway.outlierDetection).
type outlierPolicy struct {
	failures int // in a row that eject; 0: never
	base     time.Duration
	maxShare float64 // of the scheduler's endpoints ejected at once
}

// maxEjectionFactor caps an ejection at this many times the base.
const maxEjectionFactor = 10

// answered records whether an answer of e, an endpoint of p, failed (a 5xx, a
// connection failure, a first-byte timeout, a broken stream), for its error
// rate and ejection. Enough failures
// in a row eject it, unless that would eject more than the policy's share of
// p's endpoints: the scheduler fails open rather than eject them all.
func (g *Router) answered(p *scheduler, e *endpoint, failed bool) {
	// Failures of an endpoint the fleet knows is down (a frozen pod's
	// streams timing out) are the fleet's to act on: counted here they would
	// keep it ejected or passed over once it is back.
	if failed && down(&g.fleet.Snapshot([]string{e.addr})[0]) {
		return
	}
	now := g.now()
	e.noteAnswer(now, failed)
	if !failed {
		if e.out.failures.Load() != 0 {
			e.out.failures.Store(0)
		}
		return
	}
	pol := p.outliers
	n := e.out.failures.Add(1)
	if pol.failures == 0 || int(n) < pol.failures || e.ejected(now) {
		return
	}
	ejected := 0
	for _, o := range p.endpoints {
		if o.ejected(now) {
			ejected++
		}
	}
	if float64(ejected+1) > pol.maxShare*float64(len(p.endpoints)) {
		return
	}
	e.out.mu.Lock()
	// An endpoint that stayed out of trouble for a base period since its last
	// ejection starts again from the base.
	if u := e.out.until.Load(); u != 0 && now.After(time.Unix(0, u).Add(pol.base)) {
		e.out.count = 0
	}
	e.out.count++
	d := pol.base * time.Duration(min(e.out.count, maxEjectionFactor))
	e.out.until.Store(now.Add(d).UnixNano())
	count := e.out.count
	e.out.mu.Unlock()
	e.out.failures.Store(0)
	if pm := g.mesh(); pm != nil {
		pm.Ejected(e.addr, now.Add(d))
	}
	g.m.Ejections.WithLabelValues(p.name, e.addr).Inc()
	g.log.Warn("endpoint ejected: its answers keep failing", "scheduler", p.name, "endpoint", e.addr, "failures", n, "for", d, "ejections", count)
}
