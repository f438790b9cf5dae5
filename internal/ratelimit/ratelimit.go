package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits are one key's limits; 0 leaves that dimension unlimited.
type Limits struct {
	RequestsPerMinute int64
	TokensPerMinute   int64
}

// Key names what a limit applies to. Either part may be empty, e.g. an empty
// Model for a limit on all of a tenant's models. Several limits on one request
// (tenant-wide and per model) are separate Reserve calls: Cancel the earlier
// reservations when a later call denies.
type Key struct {
	Tenant, Model string
}

func (k Key) String() string { return fmt.Sprintf("tenant %q model %q", k.Tenant, k.Model) }

// keyEscaper keeps the separators and the hash-tag braces out of the names, so
// that no two Keys share Redis keys and the tag is never cut short.
var keyEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// redisKeys are the request and token state of k: kvgate:rl:{tenant:model}:req
// and :tok. The braces are a Redis Cluster hash tag: both keys of a check hash
// to one slot, as a script touching both requires, while different models of
// one tenant spread over the cluster.
func (k Key) redisKeys() [2]string {
	tag := "kvgate:rl:{" + keyEscaper.Replace(k.Tenant) + ":" + keyEscaper.Replace(k.Model) + "}"
	return [2]string{tag + ":req", tag + ":tok"}
}

// Result is one decision, with what the x-ratelimit-* headers report.
type Result struct {
	Allowed bool
	// RetryAfter is, when denied, how long until the same request would be
	// allowed were nothing else to arrive. With Redis unavailable and
	// FailClosed it is Options.RetryInterval, a hint for the 503.
	RetryAfter time.Duration
	// Requests and Tokens are the state after the decision; a dimension without
	// a limit is all zero.
	Requests, Tokens Window
	// TooLarge marks a denial of a request whose tokens exceed its
	// tokens-per-minute limit: no wait would let it through, so RetryAfter is 0.
	TooLarge bool
	// Degraded marks a decision of this replica's local limiter, taken because
	// Redis was unavailable (FailOpen).
	Degraded bool
}

// Window is one dimension's state, as OpenAI's x-ratelimit-* headers report it.
type Window struct {
	Limit     int64         // per minute
	Remaining int64         // units that could be taken now
	Reset     time.Duration // until the full limit is available again
}

// FailMode is what the limiter decides while Redis is unavailable.
type FailMode int

const (
	// FailOpen decides with a local limiter of the same semantics, per replica:
	// N replicas may then admit up to N times the limit between them.
	FailOpen FailMode = iota
	// FailClosed denies every request with an error wrapping ErrUnavailable,
	// which callers answer with 503.
	FailClosed
)

func (m FailMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// ParseFailMode reads "open" or "closed".
func ParseFailMode(s string) (FailMode, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("ratelimit: fail mode %q: want open or closed", s)
}

func (m FailMode) consequence() string {
	if m == FailClosed {
		return "failing closed: denying every rate-limited request"
	}
	return "failing open: each replica enforces the limits on its own"
}

var (
	// ErrUnavailable is wrapped by Reserve's error when Redis is unavailable
	// and the fail mode is FailClosed, and by Reconcile's and Cancel's when an
	// adjustment could not reach Redis.
	ErrUnavailable = errors.New("ratelimit: redis unavailable")
	// ErrSettled is returned by a second Reconcile or Cancel of a reservation.
	ErrSettled = errors.New("ratelimit: reservation already settled")
)

// Options tune a Limiter; zero fields take the defaults.
type Options struct {
	FailMode FailMode // default FailOpen
	// Timeout is the least time a request waits for Redis's decision before
	// its fail mode decides it; default 50 ms. The wait grows with the answer
	// times observed (see deadline), up to MaxTimeout. Enforced here, so it
	// holds whatever the client's own timeouts are.
	Timeout time.Duration
	// MaxTimeout bounds both the adaptive wait and one call: a call that
	// Redis has not answered in MaxTimeout marks it down. Default 10 × Timeout.
	MaxTimeout time.Duration
	// RetryInterval is how long after a failure decisions skip Redis before one
	// request tries it again; default 250 ms.
	RetryInterval time.Duration
	// LogInterval is the least time between two log lines about an outage;
	// default 30 s.
	LogInterval time.Duration
	Logger      *slog.Logger // default slog.Default()
	Metrics     *Metrics     // default: counted but not registered anywhere
}

// Limiter checks and reserves against the limits. It is safe for concurrent use.
type Limiter struct {
	client  redis.UniversalClient // nil: local only
	opts    Options
	m       *Metrics
	local   *localStore
	health  *health
	wait    *deadline
	timeNow func() time.Time
}

// New returns a limiter sharing its state through client. A nil client gives a
// limiter of this process alone (for a single replica without Redis); its
// results are not marked Degraded.
func New(client redis.UniversalClient, opts Options) *Limiter {
	if opts.Timeout <= 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 10 * opts.Timeout
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 250 * time.Millisecond
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	l := &Limiter{client: client, opts: opts, m: opts.Metrics, timeNow: time.Now,
		wait: newDeadline(opts.Timeout, opts.MaxTimeout)}
	l.local = newLocalStore(l.timeNow)
	l.health = &health{retry: opts.RetryInterval, logEvery: opts.LogInterval, maxWait: opts.MaxTimeout, mode: opts.FailMode,
		log: opts.Logger, up: opts.Metrics.RedisUp}
	if client != nil {
		l.m.RedisUp.Set(1) // until a call says otherwise
		l.m.RedisWait.Set(opts.Timeout.Seconds())
	}
	return l
}

// Reserve decides whether a request of k may proceed and, when it may, takes
// one request and `tokens` tokens from both limits at once; a request denied on
// either takes nothing from the other. tokens is the caller's estimate: the
// prompt's tokens plus max_tokens (or the model's limit), so that only an
// underestimated prompt can make the real usage exceed it. When allowed, the
// Reservation must be settled with Reconcile (or Cancel) once the usage is
// known; it is nil when nothing is held (denied, or no limits).
//
// A denial (429) has a nil error; so has one marked TooLarge, whose tokens
// exceed the tokens-per-minute limit (429 without Retry-After). An error means
// there is no decision: it wraps ErrUnavailable (FailClosed with Redis down:
// answer 503, with the Result's RetryAfter), the context's error, or a
// negative limit (a configuration error).
// SetHeaders can write the Result in every case.
func (l *Limiter) Reserve(ctx context.Context, k Key, lim Limits, tokens int64) (Result, *Reservation, error) {
	if lim.RequestsPerMinute < 0 || lim.TokensPerMinute < 0 {
		return Result{}, nil, fmt.Errorf("ratelimit: %s: negative limit %+v", k, lim)
	}
	if lim.RequestsPerMinute == 0 && lim.TokensPerMinute == 0 {
		return Result{Allowed: true}, nil, nil
	}
	tokens = max(tokens, 0)
	res, r, err := l.reserve(ctx, k, lim, tokens)
	if err == nil && lim.TokensPerMinute > 0 && tokens > lim.TokensPerMinute {
		// Denied by the check like any other, whose windows the headers
		// report, but no wait would let it through.
		res.TooLarge, res.RetryAfter = true, 0
	}
	return res, r, err
}

func (l *Limiter) reserve(ctx context.Context, k Key, lim Limits, tokens int64) (Result, *Reservation, error) {
	res := Result{Requests: Window{Limit: lim.RequestsPerMinute}, Tokens: Window{Limit: lim.TokensPerMinute}}
	keys := k.redisKeys()
	dims := [2]dim{newDim(lim.RequestsPerMinute, 1), newDim(lim.TokensPerMinute, tokens)}
	degraded := false
	if l.client != nil {
		why := l.health.lastError // Redis is down: skipped
		if l.health.try(l.timeNow()) {
			v, err := l.run(ctx, "reserve", reserveScript, keys[:], 6,
				dims[0].interval, dims[0].cost, dims[1].interval, dims[1].cost, window, slack)
			why = func() error { return err }
			if err == nil {
				d := decision{denied: v[0], retry: v[1], dims: [2]dimResult{{v[2], v[3]}, {v[4], v[5]}}}
				return l.result(res, d, dims, false), l.reservation(d, k, dims, false), nil
			}
		}
		if ctx.Err() != nil {
			// The caller gave up; Redis is not to blame.
			return Result{}, nil, fmt.Errorf("ratelimit: %s: %w", k, ctx.Err())
		}
		l.health.fallback.Add(1)
		if l.opts.FailMode == FailClosed {
			l.m.decided(resultUnavailable, dimNone, false)
			// No windows: there is no state to report, only when to retry.
			return Result{RetryAfter: l.opts.RetryInterval}, nil,
				fmt.Errorf("%w (fail-closed) for %s: %w", ErrUnavailable, k, why())
		}
		degraded = true
	}
	d := l.local.reserve(keys, dims)
	return l.result(res, d, dims, degraded), l.reservation(d, k, dims, true), nil
}

// run calls a script, expecting want integers back, and waits for the answer
// as long as the adaptive deadline says; past it the caller decides without
// Redis (its fail mode), but Redis is not marked down for one slow answer.
//
// The call runs in its own goroutine because go-redis applies a context to
// the socket only with ContextTimeoutEnabled. While Redis is up the call
// outlives its caller (up to MaxTimeout): an answer that arrives after the
// caller gave up shows Redis slow rather than gone, feeds the deadline and
// keeps Redis up; such a call is still applied by Redis, so the fallback
// counts that request twice, which errs on the strict side. While Redis is
// down a probe ends with its caller, so that an outage's calls are not
// applied when Redis returns.
func (l *Limiter) run(ctx context.Context, op string, s *redis.Script, keys []string, want int, args ...any) ([]int64, error) {
	type reply struct {
		v   []int64
		err error
	}
	start := l.timeNow()
	var cctx context.Context
	var cancel context.CancelFunc
	detached := !l.health.isDown()
	if !detached {
		cctx, cancel = context.WithCancel(ctx)
	} else {
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), l.opts.MaxTimeout)
	}
	ch := make(chan reply, 1)
	go func() {
		defer cancel()
		v, err := s.Run(cctx, l.client, keys, args...).Int64Slice()
		if err == nil && len(v) != want {
			err = fmt.Errorf("the script returned %d values, want %d", len(v), want)
		}
		now := l.timeNow()
		took := now.Sub(start)
		switch {
		case err == nil:
			l.m.RedisDuration.WithLabelValues(op).Observe(took.Seconds())
			l.wait.observe(took)
			l.m.RedisWait.Set(l.wait.current().Seconds())
			l.health.ok(now)
		case errors.Is(err, context.Canceled):
			// A probe dropped because its caller stopped waiting: counted
			// there, as unanswered.
		case timedOut(err):
			// Every connection busy for the pool's timeout, a dial or read
			// that timed out, no answer in MaxTimeout: this process is
			// congested or Redis slow, which is not an outage while other
			// calls are being answered (a silent Redis is one after MaxTimeout).
			l.health.unanswered(start, now)
		default:
			l.m.RedisDuration.WithLabelValues(op).Observe(took.Seconds())
			l.health.failed(now, err)
		}
		ch <- reply{v, err}
	}()
	wait := l.wait.current()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var r reply
	select {
	case r = <-ch:
	case <-timer.C:
		r.err = fmt.Errorf("no answer in %v", wait)
		l.wait.gaveUp(wait)
		l.m.RedisWait.Set(l.wait.current().Seconds())
		l.health.unanswered(start, l.timeNow())
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	// A probe ends with its caller; so does a detached call still waiting
	// for a connection once Redis is down.
	if !detached || l.health.isDown() {
		cancel()
	}
	if r.err != nil {
		if ctx.Err() == nil {
			l.m.RedisErrors.WithLabelValues(op).Inc()
		}
		return nil, fmt.Errorf("ratelimit: redis %s: %w", op, r.err)
	}
	return r.v, nil
}

// timedOut reports whether err is a timeout rather than an answer or a
// refusal: go-redis's pool timeout, a network timeout (dial or read), or the
// call's own deadline.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// result fills res from a decision and counts it.
func (l *Limiter) result(res Result, d decision, dims [2]dim, degraded bool) Result {
	res.Allowed = d.denied == 0
	res.Degraded = degraded
	if !res.Allowed {
		res.RetryAfter = time.Duration(d.retry) * time.Microsecond
	}
	for i, w := range []*Window{&res.Requests, &res.Tokens} {
		if dims[i].interval > 0 {
			w.Remaining = d.dims[i].remaining
			w.Reset = time.Duration(d.dims[i].reset) * time.Microsecond
		}
	}
	result := resultAllowed
	if !res.Allowed {
		result = resultDenied
	}
	l.m.decided(result, deniedDimension(d.denied), degraded)
	return res
}

func (l *Limiter) reservation(d decision, k Key, dims [2]dim, local bool) *Reservation {
	if d.denied != 0 {
		return nil
	}
	return &Reservation{l: l, key: k, dims: dims, local: local}
}

// Reservation is what an allowed request holds until its usage is known.
// Settle it once, with Reconcile or Cancel; both do nothing on a nil
// Reservation, so callers need not check.
type Reservation struct {
	l       *Limiter
	key     Key
	dims    [2]dim // as reserved: the intervals of the limits then, and the costs
	local   bool   // taken by the local limiter
	settled atomic.Bool
}

// Tokens is the number of tokens reserved.
func (r *Reservation) Tokens() int64 {
	if r == nil {
		return 0
	}
	return int64(r.dims[1].cost)
}

// Reconcile replaces the reserved tokens with the actual usage: the token
// limit's TAT moves by (actual − reserved) × interval, a refund when fewer were
// used, a charge when more were. A refund never moves the TAT before now, so
// unused allowance does not pile up beyond the burst. A charge is applied even
// past the limit: the tokens were served, and later requests wait for them.
//
// Pass a context that outlives the client's request (context.WithoutCancel):
// a client that hangs up mid-stream has still been served tokens. An error
// wrapping ErrUnavailable means the adjustment is lost; the limiter has
// already logged the outage, so callers need not log it again.
func (r *Reservation) Reconcile(ctx context.Context, actualTokens int64) error {
	if r == nil {
		return nil
	}
	if !r.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	delta := max(actualTokens, 0) - int64(r.dims[1].cost)
	return r.adjust(ctx, 0, delta)
}

// Cancel gives back the whole reservation, the request included, for a request
// that was never served: refused later (by another limit, or for want of a
// member) or failed before reaching a model server.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r == nil {
		return nil
	}
	if !r.settled.CompareAndSwap(false, true) {
		return ErrSettled
	}
	return r.adjust(ctx, -1, -int64(r.dims[1].cost))
}

// adjust moves the request debt by requests units and the token debt by tokens.
func (r *Reservation) adjust(ctx context.Context, requests, tokens int64) error {
	l := r.l
	deltas := [2]float64{float64(requests) * r.dims[0].interval, float64(tokens) * r.dims[1].interval}
	if deltas[0] == 0 && deltas[1] == 0 {
		return nil
	}
	keys := r.key.redisKeys()
	if r.local {
		l.local.adjust(keys, deltas)
	} else {
		// Lost while Redis is down: the local limiter never saw the reservation.
		if !l.health.try(l.timeNow()) {
			return fmt.Errorf("%w: %s: adjustment of %d requests, %d tokens lost: %w", ErrUnavailable, r.key, requests, tokens, l.health.lastError())
		}
		if _, err := l.run(ctx, "adjust", adjustScript, keys[:], 1, deltas[0], deltas[1]); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("ratelimit: %s: adjustment of %d requests, %d tokens lost: %w", r.key, requests, tokens, ctx.Err())
			}
			return fmt.Errorf("%w: %s: adjustment of %d requests, %d tokens lost: %w", ErrUnavailable, r.key, requests, tokens, err)
		}
	}
	if r.dims[1].interval > 0 {
		switch {
		case tokens < 0:
			l.m.Reconciled.WithLabelValues("refunded").Add(float64(-tokens))
		case tokens > 0:
			l.m.Reconciled.WithLabelValues("charged").Add(float64(tokens))
		}
	}
	return nil
}
