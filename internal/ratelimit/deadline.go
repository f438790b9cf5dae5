package ratelimit

import (
	"sync"
	"time"
)

// deadline is how long a request waits for Redis's decision: the
// retransmission timeout of RFC 6298 over the answers seen so far (smoothed
// time + 4 × its mean deviation, and at least twice the smoothed time, since
// steady answers leave no deviation to wait for), at least floor and at most
// ceil. It learns from answers that came after their caller gave up as well,
// and backs off while none comes, so a Redis (or a process) slowed by a busy
// machine lengthens the wait instead of failing every request that meets the
// slowdown.
type deadline struct {
	floor, ceil time.Duration

	mu           sync.Mutex
	srtt, rttvar time.Duration // 0 before the first answer
	backoff      time.Duration // after a caller gave up, until the next answer; 0 otherwise
}

func newDeadline(floor, ceil time.Duration) *deadline {
	return &deadline{floor: floor, ceil: max(ceil, floor)}
}

// observe adds the time one call took to answer.
func (d *deadline) observe(rtt time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.backoff = 0
	if d.srtt == 0 {
		d.srtt, d.rttvar = rtt, rtt/2
		return
	}
	dev := d.srtt - rtt
	if dev < 0 {
		dev = -dev
	}
	d.rttvar = (3*d.rttvar + dev) / 4
	d.srtt = (7*d.srtt + rtt) / 8
}

// gaveUp doubles the wait after a caller waited `waited` in vain, until the
// next answer (RFC 6298's back-off): until a late answer shows how slow Redis
// has become, each caller waits twice as long as the last one that gave up.
func (d *deadline) gaveUp(waited time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.backoff = min(max(d.backoff, 2*waited), d.ceil)
}

// current is the wait for the next call.
func (d *deadline) current() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	rto := d.srtt + max(4*d.rttvar, d.srtt)
	return min(max(rto, d.floor, d.backoff), d.ceil)
}
