package ratelimit

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// health tracks whether Redis answers. Redis is down after an error, or when
// no call has been answered for maxWait while calls kept giving up: one slow
// answer is not an outage. After a failure Redis is left alone for retry, and
// then tried by one request at a time, so that an outage that times out costs
// one wait per retry interval rather than one per request; the first call
// that succeeds ends the outage. It also keeps the outage's log
// to a few lines: at most one warning per logEvery, and the recovery line only
// when the outage had been announced.
type health struct {
	retry, logEvery time.Duration
	maxWait         time.Duration
	mode            FailMode
	log             *slog.Logger
	up              prometheus.Gauge

	downUntil atomic.Int64 // unix ns before which Redis is not tried; 0 while it answers
	down      atomic.Bool
	fallback  atomic.Int64 // decisions taken without Redis since the last log line

	lastAnswer  atomic.Int64 // unix ns of the last answer
	silentSince atomic.Int64 // unix ns since which calls went unanswered; 0 after an answer

	mu        sync.Mutex
	since     time.Time // first failure of the current outage
	logged    time.Time // last log line
	announced bool      // the current outage has been logged
	errs      int64     // failures since the last log line
	last      error
}

// try reports whether this call should go to Redis.
func (h *health) try(now time.Time) bool {
	until := h.downUntil.Load()
	if until == 0 {
		return true
	}
	if now.UnixNano() < until {
		return false
	}
	// One prober per interval; the others decide without Redis meanwhile.
	return h.downUntil.CompareAndSwap(until, now.Add(h.retry).UnixNano())
}

func (h *health) failed(now time.Time, err error) {
	h.downUntil.Store(now.Add(h.retry).UnixNano())
	h.down.Store(true)
	h.up.Set(0)

	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = err
	h.errs++
	if h.since.IsZero() {
		h.since = now
	}
	if !h.logged.IsZero() && now.Sub(h.logged) < h.logEvery {
		return
	}
	if !h.announced {
		h.log.Warn("ratelimit: redis unavailable; "+h.mode.consequence(), "err", err)
	} else {
		h.log.Warn("ratelimit: redis still unavailable; "+h.mode.consequence(), "err", err,
			"for", now.Sub(h.since).Round(time.Millisecond), "errors", h.errs, "decisions_without_redis", h.fallback.Load())
	}
	h.announced, h.logged, h.errs = true, now, 0
	h.fallback.Store(0)
}

// unanswered records a call begun at start that its caller stopped waiting
// for at now, with no answer yet; Redis is down once calls have gone
// unanswered for maxWait.
func (h *health) unanswered(start, now time.Time) {
	h.silentSince.CompareAndSwap(0, max(start.UnixNano(), h.lastAnswer.Load()))
	if since := h.silentSince.Load(); since != 0 && now.UnixNano()-since >= int64(h.maxWait) {
		h.failed(now, fmt.Errorf("no answer in %v", h.maxWait))
	}
}

func (h *health) ok(now time.Time) {
	h.lastAnswer.Store(now.UnixNano())
	h.silentSince.Store(0)
	if !h.down.Load() || !h.down.CompareAndSwap(true, false) {
		return
	}
	h.downUntil.Store(0)
	h.up.Set(1)

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.announced {
		h.log.Info("ratelimit: redis available again; limits are shared again",
			"after", now.Sub(h.since).Round(time.Millisecond), "decisions_without_redis", h.fallback.Load())
		h.logged, h.errs = now, 0
		h.fallback.Store(0)
	}
	h.announced, h.since = false, time.Time{}
}

// isDown reports whether Redis is taken to be down (decisions skip it).
func (h *health) isDown() bool { return h.down.Load() }

// lastError is the error that made Redis unavailable.
func (h *health) lastError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}
