package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/promtest"

	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// skip marks a remaining count a step does not check.
const skip = -1

// env is one limiter under test, on Redis or on the local store alone.
type env struct {
	l     *Limiter
	reg   *prometheus.Registry
	srv   *redistest.Server // nil for the local store
	rdb   *redis.Client     // a client of srv, to look at the keys
	clock *fakeClock        // the local store's time; nil on Redis
}

const (
	onRedis = "redis"
	onLocal = "local"
)

var backends = []string{onRedis, onLocal}

func newEnv(t *testing.T, backend string, opts Options) *env {
	t.Helper()
	e := &env{reg: prometheus.NewRegistry()}
	opts.Metrics = NewMetrics(e.reg)
	switch backend {
	case onRedis:
		e.srv = redistest.Start(t)
		e.rdb = e.srv.Client(t)
		e.l = New(e.srv.Client(t), opts)
	case onLocal:
		e.clock = &fakeClock{t: time.Unix(1_700_000_000, 0)}
		e.l = New(nil, opts)
		e.l.timeNow = e.clock.Now
		e.l.local = newLocalStore(e.clock.Now)
	}
	return e
}

// advance lets d pass for k: on the local store by moving its clock, on Redis
// by moving the keys' last update back (Redis's clock cannot be moved).
func (e *env) advance(t *testing.T, k Key, d time.Duration) {
	t.Helper()
	if e.clock != nil {
		e.clock.Add(d)
		return
	}
	ctx := context.Background()
	for _, key := range k.redisKeys() {
		at, err := e.rdb.HGet(ctx, key, "t").Float64()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.HSet(ctx, key, "t", strconv.FormatFloat(at-float64(d.Microseconds()), 'f', -1, 64)).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// step is one action of a scenario, and what it must return.
type step struct {
	do      string        // reserve (the default), reconcile, cancel, advance
	tokens  int64         // reserve: the estimate; reconcile: the actual usage
	lim     *Limits       // reserve with these limits instead of the scenario's
	of      int           // reconcile, cancel: the step whose reservation to settle
	advance time.Duration // advance: time passing

	allowed  bool
	tooLarge bool
	err      error // wanted, with errors.Is
	req, tok int64 // remaining wanted, or skip
	retry    time.Duration
}

// On Redis the clock runs during a scenario, so a wanted RetryAfter may come
// out this much shorter; the scenarios' intervals are far longer.
const retrySlack = 250 * time.Millisecond

func runSteps(t *testing.T, e *env, k Key, lim Limits, steps []step) {
	t.Helper()
	ctx := context.Background()
	held := make([]*Reservation, len(steps))
	for i, s := range steps {
		switch s.do {
		case "advance":
			e.advance(t, k, s.advance)
		case "reconcile", "cancel":
			var err error
			if s.do == "reconcile" {
				err = held[s.of].Reconcile(ctx, s.tokens)
			} else {
				err = held[s.of].Cancel(ctx)
			}
			if !errors.Is(err, s.err) {
				t.Fatalf("step %d: %s of step %d: error %v, want %v", i, s.do, s.of, err, s.err)
			}
		default:
			l := lim
			if s.lim != nil {
				l = *s.lim
			}
			res, r, err := e.l.Reserve(ctx, k, l, s.tokens)
			held[i] = r
			if !errors.Is(err, s.err) {
				t.Fatalf("step %d: reserve %d tokens: error %v, want %v", i, s.tokens, err, s.err)
			}
			if res.Allowed != s.allowed || (r != nil) != s.allowed {
				t.Fatalf("step %d: reserve %d tokens: allowed %v (reservation %v), want %v; %+v", i, s.tokens, res.Allowed, r != nil, s.allowed, res)
			}
			if s.req != skip && res.Requests.Remaining != s.req {
				t.Errorf("step %d: %d requests remaining, want %d; %+v", i, res.Requests.Remaining, s.req, res)
			}
			if s.tok != skip && res.Tokens.Remaining != s.tok {
				t.Errorf("step %d: %d tokens remaining, want %d; %+v", i, res.Tokens.Remaining, s.tok, res)
			}
			if res.RetryAfter > s.retry || res.RetryAfter < s.retry-retrySlack {
				t.Errorf("step %d: retry after %v, want %v", i, res.RetryAfter, s.retry)
			}
			if res.TooLarge != s.tooLarge {
				t.Errorf("step %d: too large %v, want %v", i, res.TooLarge, s.tooLarge)
			}
			if res.Degraded {
				t.Errorf("step %d: degraded with Redis up", i)
			}
		}
	}
}

func TestScenarios(t *testing.T) {
	tokensOnly := &Limits{TokensPerMinute: 100} // with 0 tokens: a look at the token limit that takes nothing
	cases := []struct {
		name  string
		lim   Limits
		steps []step
	}{
		{"requests: exactly the limit, then denied until one interval passes", Limits{RequestsPerMinute: 3}, []step{
			{allowed: true, req: 2, tok: skip},
			{allowed: true, req: 1, tok: skip},
			{allowed: true, req: 0, tok: skip},
			{req: 0, tok: skip, retry: 20 * time.Second},
			{do: "advance", advance: 20 * time.Second},
			{allowed: true, req: 0, tok: skip},
			{req: 0, tok: skip, retry: 20 * time.Second},
		}},
		{"tokens: a reservation that does not fit is denied", Limits{TokensPerMinute: 100}, []step{
			{tokens: 40, allowed: true, req: skip, tok: 60},
			{tokens: 70, req: skip, tok: 60, retry: 10 * 600 * time.Millisecond},
			{tokens: 60, allowed: true, req: skip, tok: 0},
			{tokens: 1, req: skip, tok: 0, retry: 600 * time.Millisecond},
		}},
		{"tokens: more than a minute's worth can never fit and takes nothing", Limits{RequestsPerMinute: 5, TokensPerMinute: 100}, []step{
			{tokens: 101, tooLarge: true, req: 5, tok: 100},
			{tokens: 1 << 62, tooLarge: true, req: 5, tok: 100},
			{tokens: 100, allowed: true, req: 4, tok: 0},
		}},
		{"denied on requests takes no tokens", Limits{RequestsPerMinute: 2, TokensPerMinute: 100}, []step{
			{tokens: 10, allowed: true, req: 1, tok: 90},
			{tokens: 10, allowed: true, req: 0, tok: 80},
			{tokens: 10, req: 0, tok: 80, retry: 30 * time.Second},
			{lim: tokensOnly, allowed: true, req: skip, tok: 80},
		}},
		{"denied on tokens takes no request", Limits{RequestsPerMinute: 10, TokensPerMinute: 100}, []step{
			{tokens: 90, allowed: true, req: 9, tok: 10},
			{tokens: 20, req: 9, tok: 10, retry: 10 * 600 * time.Millisecond},
			{tokens: 10, allowed: true, req: 8, tok: 0},
		}},
		{"denied on both waits for the later", Limits{RequestsPerMinute: 1, TokensPerMinute: 100}, []step{
			{tokens: 100, allowed: true, req: 0, tok: 0},
			{tokens: 50, req: 0, tok: 0, retry: 60 * time.Second},
		}},
		{"reconcile refunds what was not used", Limits{TokensPerMinute: 100}, []step{
			{tokens: 60, allowed: true, req: skip, tok: 40},
			{do: "reconcile", of: 0, tokens: 25},
			{lim: tokensOnly, allowed: true, req: skip, tok: 75},
		}},
		{"reconcile charges what was used beyond the reservation", Limits{TokensPerMinute: 100}, []step{
			{tokens: 10, allowed: true, req: skip, tok: 90},
			{do: "reconcile", of: 0, tokens: 30},
			{lim: tokensOnly, allowed: true, req: skip, tok: 70},
		}},
		{"a refund never moves the TAT before now", Limits{TokensPerMinute: 100}, []step{
			{tokens: 50, allowed: true, req: skip, tok: 50},
			{do: "advance", advance: time.Minute},
			{do: "reconcile", of: 0, tokens: 0}, // 50 refunded, but the limit is full already
			{lim: tokensOnly, allowed: true, req: skip, tok: 100},
			{tokens: 100, allowed: true, req: skip, tok: 0},
			{tokens: 1, req: skip, tok: 0, retry: 600 * time.Millisecond},
		}},
		{"a stream overshoots by its own reservation error, then pays it back", Limits{TokensPerMinute: 100}, []step{
			// The stream reserves prompt estimate 10 + max_tokens 20; another
			// request takes the rest of the minute.
			{tokens: 30, allowed: true, req: skip, tok: 70},
			{tokens: 70, allowed: true, req: skip, tok: 0},
			{tokens: 1, req: skip, tok: 0, retry: 600 * time.Millisecond},
			// The prompt was 5 tokens longer than estimated: 105 served, 5 over.
			{do: "reconcile", of: 0, tokens: 35},
			{do: "reconcile", of: 1, tokens: 70},
			// Before the next token may pass, the 5 are paid back: 6 × 600 ms.
			{tokens: 1, req: skip, tok: 0, retry: 6 * 600 * time.Millisecond},
			{do: "advance", advance: 3 * time.Second},
			{tokens: 1, req: skip, tok: 0, retry: 600 * time.Millisecond},
			{do: "advance", advance: 600 * time.Millisecond},
			{tokens: 1, allowed: true, req: skip, tok: 0},
		}},
		{"cancel gives back the request and its tokens", Limits{RequestsPerMinute: 2, TokensPerMinute: 100}, []step{
			{tokens: 30, allowed: true, req: 1, tok: 70},
			{do: "cancel", of: 0},
			{tokens: 0, allowed: true, req: 1, tok: 100},
		}},
		{"a reservation settles once", Limits{RequestsPerMinute: 2, TokensPerMinute: 100}, []step{
			{tokens: 30, allowed: true, req: 1, tok: 70},
			{do: "reconcile", of: 0, tokens: 20},
			{do: "reconcile", of: 0, tokens: 20, err: ErrSettled},
			{do: "cancel", of: 0, err: ErrSettled},
			{tokens: 0, allowed: true, req: 0, tok: 80},
		}},
	}
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, Options{})
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					runSteps(t, e, Key{Tenant: "tenant-" + strconv.Itoa(i), Model: "m"}, c.lim, c.steps)
				})
			}
			t.Run("no limits: allowed, nothing held, nothing stored", func(t *testing.T) {
				res, r, err := e.l.Reserve(context.Background(), Key{Tenant: "free"}, Limits{}, 1<<40)
				if err != nil || !res.Allowed || r != nil || res.Requests != (Window{}) || res.Tokens != (Window{}) {
					t.Fatalf("got %+v, %v, %v", res, r, err)
				}
				if err := r.Reconcile(context.Background(), 5); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestRequestsBoundary: a burst takes exactly the limit, whatever rounding the
// interval 60 s / limit has.
func TestRequestsBoundary(t *testing.T) {
	for _, backend := range backends {
		limits := []int64{1, 7, 100}
		if backend == onLocal {
			// Too many for one interval of real time on Redis: 333 calls must
			// all land within 180 ms, which a loaded 2-core -race run missed.
			limits = append(limits, 333, 9000, 99991)
		}
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, Options{})
			for _, limit := range limits {
				t.Run(strconv.FormatInt(limit, 10), func(t *testing.T) {
					ctx := context.Background()
					k := Key{Tenant: "boundary", Model: strconv.FormatInt(limit, 10)}
					lim := Limits{RequestsPerMinute: limit}
					for i := range limit {
						res, _, err := e.l.Reserve(ctx, k, lim, 0)
						if err != nil || !res.Allowed || res.Requests.Remaining != limit-1-i {
							t.Fatalf("request %d of %d: %+v, %v", i+1, limit, res, err)
						}
					}
					res, _, err := e.l.Reserve(ctx, k, lim, 0)
					interval := time.Minute / time.Duration(limit)
					if err != nil || res.Allowed || res.Requests.Remaining != 0 || res.RetryAfter > interval+time.Microsecond || res.RetryAfter < interval-retrySlack {
						t.Fatalf("request %d of %d: %+v, %v; want denied, retry after %v", limit+1, limit, res, err, interval)
					}
					if res.Requests.Reset > time.Minute || res.Requests.Reset < time.Minute-retrySlack {
						t.Errorf("reset %v, want a minute", res.Requests.Reset)
					}
				})
			}
		})
	}
}

func TestKeys(t *testing.T) {
	cases := []struct {
		k        Key
		req, tok string
	}{
		{Key{"acme", "llama-3-8b"}, "kvgate:rl:{acme:llama-3-8b}:req", "kvgate:rl:{acme:llama-3-8b}:tok"},
		{Key{"", ""}, "kvgate:rl:{:}:req", "kvgate:rl:{:}:tok"},
		{Key{"a:b", "c"}, "kvgate:rl:{a%3Ab:c}:req", "kvgate:rl:{a%3Ab:c}:tok"},
		{Key{"}{", "%"}, "kvgate:rl:{%7D%7B:%25}:req", "kvgate:rl:{%7D%7B:%25}:tok"},
	}
	seen := map[string]Key{}
	for _, c := range cases {
		t.Run(c.k.String(), func(t *testing.T) {
			keys := c.k.redisKeys()
			if keys[0] != c.req || keys[1] != c.tok {
				t.Errorf("keys %q, want %q, %q", keys, c.req, c.tok)
			}
			if hashTag(keys[0]) != hashTag(keys[1]) || hashTag(keys[0]) == "" {
				t.Errorf("hash tags %q and %q differ: the keys may land in different cluster slots", hashTag(keys[0]), hashTag(keys[1]))
			}
			if other, ok := seen[keys[0]]; ok {
				t.Errorf("%v and %v share keys", c.k, other)
			}
			seen[keys[0]] = c.k
		})
	}
	if (Key{"a:b", "c"}).redisKeys() == (Key{"a", "b:c"}).redisKeys() {
		t.Error("tenant a:b model c and tenant a model b:c share keys")
	}
}

// hashTag is what Redis Cluster hashes: the text between the first { and the
// first } after it, when not empty.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					return key[i+1 : j]
				}
			}
			return ""
		}
	}
	return ""
}

// TestKeysExpire: a key lives only until its debt is repaid; settling a
// reservation back to nothing deletes it.
func TestKeysExpire(t *testing.T) {
	e := newEnv(t, onRedis, Options{})
	ctx := context.Background()
	keys := func(k Key) (req, tok string) { ks := k.redisKeys(); return ks[0], ks[1] }

	cases := []struct {
		name           string
		lim            Limits
		n              int
		tokens         int64
		reqTTL, tokTTL time.Duration // upper bounds; the lower is 1 ms less, or 100 ms on a burst
	}{
		{"one request of 60 per minute owes a second", Limits{RequestsPerMinute: 60}, 1, 0, time.Second, 0},
		{"a full burst owes a minute", Limits{RequestsPerMinute: 10, TokensPerMinute: 1000}, 10, 100, time.Minute, time.Minute},
		{"tokens owe their share", Limits{TokensPerMinute: 600}, 1, 30, 0, 3 * time.Second},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Key{Tenant: "ttl", Model: strconv.Itoa(i)}
			for range c.n {
				if res, _, err := e.l.Reserve(ctx, k, c.lim, c.tokens); err != nil || !res.Allowed {
					t.Fatalf("%+v, %v", res, err)
				}
			}
			req, tok := keys(k)
			for _, kt := range []struct {
				key string
				ttl time.Duration
			}{{req, c.reqTTL}, {tok, c.tokTTL}} {
				got, err := e.rdb.PTTL(ctx, kt.key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if kt.ttl == 0 {
					if got != -2*time.Nanosecond && got != -2*time.Millisecond { // go-redis: -2 = no such key
						t.Errorf("%s: TTL %v, want no key (unlimited)", kt.key, got)
					}
					continue
				}
				if got > kt.ttl || got < kt.ttl-100*time.Millisecond {
					t.Errorf("%s: TTL %v, want about %v", kt.key, got, kt.ttl)
				}
			}
		})
	}

	t.Run("an idle key is gone", func(t *testing.T) {
		k := Key{Tenant: "ttl", Model: "short"}
		if _, _, err := e.l.Reserve(ctx, k, Limits{RequestsPerMinute: 6000}, 0); err != nil { // owes 10 ms
			t.Fatal(err)
		}
		req, _ := keys(k)
		deadline := time.Now().Add(2 * time.Second)
		for e.rdb.Exists(ctx, req).Val() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still there 2 s after a 10 ms debt", req)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("a reservation refunded in full deletes the key", func(t *testing.T) {
		k := Key{Tenant: "ttl", Model: "refund"}
		_, r, err := e.l.Reserve(ctx, k, Limits{TokensPerMinute: 1000}, 500)
		if err != nil {
			t.Fatal(err)
		}
		_, tok := keys(k)
		if e.rdb.Exists(ctx, tok).Val() != 1 {
			t.Fatal("no token key after a reservation")
		}
		if err := r.Reconcile(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if e.rdb.Exists(ctx, tok).Val() != 0 {
			t.Error("token key still there after a full refund")
		}
	})
}

// TestLocalSweep: the local store forgets keys whose debt is repaid.
func TestLocalSweep(t *testing.T) {
	e := newEnv(t, onLocal, Options{})
	ctx := context.Background()
	for i := range 100 {
		if _, _, err := e.l.Reserve(ctx, Key{Tenant: strconv.Itoa(i)}, Limits{RequestsPerMinute: 60, TokensPerMinute: 600}, 6); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.l.local.size(); n != 200 {
		t.Fatalf("%d keys held, want 200", n)
	}
	e.clock.Add(time.Minute + time.Second)
	if _, _, err := e.l.Reserve(ctx, Key{Tenant: "new"}, Limits{RequestsPerMinute: 60}, 0); err != nil {
		t.Fatal(err)
	}
	if n := e.l.local.size(); n != 1 {
		t.Errorf("%d keys held a minute later, want only the new one", n)
	}
}

func TestMetrics(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			e := newEnv(t, backend, Options{})
			ctx := context.Background()
			k, lim := Key{Tenant: "m"}, Limits{RequestsPerMinute: 2, TokensPerMinute: 100}
			_, r1, _ := e.l.Reserve(ctx, k, lim, 40) // allowed
			_, r2, _ := e.l.Reserve(ctx, k, lim, 40) // allowed
			_, _, _ = e.l.Reserve(ctx, k, lim, 40)   // denied: both
			_, _, _ = e.l.Reserve(ctx, Key{Tenant: "n"}, lim, 101)
			_ = r1.Reconcile(ctx, 10)
			_ = r2.Reconcile(ctx, 55)
			for _, c := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"kvgate_ratelimit_decisions_total", []string{"result", "allowed", "dimension", "none"}, 2},
				{"kvgate_ratelimit_decisions_total", []string{"result", "denied", "dimension", "both"}, 1},
				{"kvgate_ratelimit_decisions_total", []string{"result", "denied", "dimension", "tokens"}, 1},
				{"kvgate_ratelimit_degraded_decisions_total", nil, 0},
				{"kvgate_ratelimit_reconciled_tokens_total", []string{"direction", "refunded"}, 30},
				{"kvgate_ratelimit_reconciled_tokens_total", []string{"direction", "charged"}, 15},
				{"kvgate_ratelimit_redis_errors_total", nil, 0},
			} {
				if got := promtest.Value(t, e.reg, c.name, c.labels...); got != c.want {
					t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
				}
			}
		})
	}
}

// TestTwoReplicas: two limiters with their own Redis clients, as two `kvgate
// global` replicas, share one limit of 6000 RPM (100/s) under 500 requests/s.
// The burst (6000) is taken first, so that the steady part measures the shared
// rate; the admitted total is then compared with burst + rate × duration.
func TestTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("4 s of load")
	}
	srv := redistest.Start(t)
	// A wait well above the default's 50 ms: the test is about the shared
	// count, and on a loaded machine under the race detector an answer now
	// and then takes longer than 50 ms, which the fail mode would decide.
	opts := Options{Timeout: 500 * time.Millisecond}
	replicas := []*Limiter{New(srv.Client(t), opts), New(srv.Client(t), opts)}
	ctx := context.Background()
	k, lim := Key{Tenant: "shared", Model: "m"}, Limits{RequestsPerMinute: 6000}
	const (
		rate     = 100.0 // per second: 6000 per minute
		offered  = 500   // requests per second, both replicas together
		duration = 4 * time.Second
	)

	// The burst, alternately through both replicas, as fast as they go.
	start := time.Now()
	burst := 0
	for i := 0; ; i++ {
		res, _, err := replicas[i%2].Reserve(ctx, k, lim, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			break
		}
		burst++
	}

	// The steady load: each replica gets every other request of an even
	// 500/s schedule, each request in its own goroutine.
	var mu sync.Mutex
	var admitted, denied, degraded int
	var wg sync.WaitGroup
	loadStart := time.Now()
	n := int(offered * duration.Seconds())
	for i := range n {
		time.Sleep(time.Until(loadStart.Add(time.Duration(i) * time.Second / offered)))
		wg.Go(func() {
			res, _, err := replicas[i%2].Reserve(ctx, k, lim, 0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case res.Degraded:
				degraded++
			case res.Allowed:
				admitted++
			default:
				denied++
			}
		})
	}
	wg.Wait()
	end := time.Now()

	elapsed := end.Sub(start)
	allowance := 6000 + rate*elapsed.Seconds()
	total := burst + admitted
	steadyAllowance := rate * end.Sub(loadStart).Seconds() // what the limit refills during the load (plus the refill between burst and load, < 1)
	t.Logf("burst %d in %v; load: %d offered in %v, %d admitted (%.1f/s), %d denied; total %d of an allowance of %.0f (%+.2f%%); steady part %d of %.0f (%+.2f%%)",
		burst, loadStart.Sub(start).Round(time.Millisecond), n, end.Sub(loadStart).Round(time.Millisecond),
		admitted, float64(admitted)/end.Sub(loadStart).Seconds(), denied,
		total, allowance, 100*(float64(total)/allowance-1), admitted, steadyAllowance, 100*(float64(admitted)/steadyAllowance-1))
	if degraded > 0 {
		t.Fatalf("%d degraded decisions with Redis up", degraded)
	}
	if burst < 6000 || float64(burst) > 6000+rate*loadStart.Sub(start).Seconds()+1 {
		t.Errorf("burst took %d, want 6000 plus what %v refills", burst, loadStart.Sub(start))
	}
	if d := float64(total)/allowance - 1; d > 0.05 || d < -0.05 {
		t.Errorf("total admitted %d is %+.2f%% off the allowance %.0f", total, 100*d, allowance)
	}
	if d := float64(admitted)/steadyAllowance - 1; d > 0.05 || d < -0.05 {
		t.Errorf("admitted under steady load %d is %+.2f%% off the %.0f the rate allows", admitted, 100*d, steadyAllowance)
	}
}

// TestRedisDown: Redis killed mid-run, then restarted, under each fail mode.
func TestRedisDown(t *testing.T) {
	k, lim := Key{Tenant: "down", Model: "m"}, Limits{RequestsPerMinute: 20, TokensPerMinute: 1000}
	for _, mode := range []FailMode{FailOpen, FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			var logs logtest.Buffer
			srv := redistest.Start(t)
			reg := prometheus.NewRegistry()
			opts := Options{FailMode: mode, RetryInterval: 50 * time.Millisecond, LogInterval: time.Hour,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: NewMetrics(reg)}
			a, b := New(srv.Client(t), opts), New(srv.Client(t), Options{Logger: slog.New(slog.DiscardHandler)})
			ctx := context.Background()

			// Shared: 5 through a, seen by b.
			for range 5 {
				if res, _, err := a.Reserve(ctx, k, lim, 10); err != nil || !res.Allowed || res.Degraded {
					t.Fatalf("before the outage: %+v, %v", res, err)
				}
			}
			if res, _, _ := b.Reserve(ctx, k, lim, 10); res.Requests.Remaining != 14 {
				t.Fatalf("replica b sees %d requests remaining, want 14", res.Requests.Remaining)
			}

			srv.Kill()
			switch mode {
			case FailOpen:
				// The local limiter starts with a full burst of its own: exactly
				// 20 requests, then denials, all degraded.
				allowed := 0
				for i := range 100 {
					res, r, err := a.Reserve(ctx, k, lim, 10)
					if err != nil || !res.Degraded {
						t.Fatalf("request %d with Redis down: %+v, %v; want a degraded decision", i, res, err)
					}
					if res.Allowed {
						allowed++
						if err := r.Reconcile(ctx, 10); err != nil {
							t.Fatalf("reconciling a local reservation: %v", err)
						}
					}
				}
				if allowed != 20 {
					t.Errorf("the local limiter allowed %d of 100, want 20", allowed)
				}
				if got := promtest.Value(t, reg, "kvgate_ratelimit_degraded_decisions_total"); got != 100 {
					t.Errorf("degraded decisions %v, want 100", got)
				}
			case FailClosed:
				for i := range 100 {
					res, r, err := a.Reserve(ctx, k, lim, 10)
					if !errors.Is(err, ErrUnavailable) || res.Allowed || r != nil || res.RetryAfter != opts.RetryInterval {
						t.Fatalf("request %d with Redis down: %+v, %v; want ErrUnavailable", i, res, err)
					}
				}
				if got := promtest.Value(t, reg, "kvgate_ratelimit_decisions_total", "result", "unavailable"); got != 100 {
					t.Errorf("unavailable decisions %v, want 100", got)
				}
			}
			if got := promtest.Value(t, reg, "kvgate_ratelimit_redis_errors_total"); got < 1 {
				t.Error("no redis error counted")
			}
			if got := promtest.Value(t, reg, "kvgate_ratelimit_redis_up"); got != 0 {
				t.Errorf("redis_up %v with Redis down", got)
			}

			// Back: the first answer ends the outage, and the limit is shared
			// again (on an empty Redis: the restarted server kept nothing).
			srv.Restart(t)
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, _, err := a.Reserve(ctx, k, lim, 10)
				if err == nil && !res.Degraded {
					if !res.Allowed || res.Requests.Remaining != 19 {
						t.Fatalf("first decision after the restart: %+v, want allowed with 19 left", res)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("still not back on Redis 5 s after its restart: %+v, %v", res, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if res, _, err := b.Reserve(ctx, k, lim, 10); err != nil || res.Degraded || res.Requests.Remaining != 18 {
				t.Fatalf("replica b after the restart: %+v, %v; want 18 left, shared with a", res, err)
			}
			if got := promtest.Value(t, reg, "kvgate_ratelimit_redis_up"); got != 1 {
				t.Errorf("redis_up %v after recovery", got)
			}

			// Logged, but not once a request: one warning and one recovery line.
			out := logs.String()
			if n := bytes.Count([]byte(out), []byte("\n")); n != 2 ||
				!bytes.Contains([]byte(out), []byte("redis unavailable")) || !bytes.Contains([]byte(out), []byte("redis available again")) {
				t.Errorf("want two log lines, got:\n%s", out)
			}
		})
	}
}

// TestTimeout: a Redis that accepts connections and never answers costs each
// request the wait (Timeout) until a call has gone MaxTimeout unanswered; then
// Redis is down and requests are decided without waiting for it.
func TestTimeout(t *testing.T) {
	ln, err := netListen(t)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: ln, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	reg := prometheus.NewRegistry()
	const wait, maxWait = 50 * time.Millisecond, 400 * time.Millisecond
	l := New(c, Options{Timeout: wait, MaxTimeout: maxWait, RetryInterval: time.Hour, Logger: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg)})
	ctx := context.Background()
	lim := Limits{RequestsPerMinute: 1000}

	start := time.Now()
	res, _, err := l.Reserve(ctx, Key{Tenant: "t"}, lim, 0)
	if took := time.Since(start); err != nil || !res.Degraded || !res.Allowed || took < wait || took > maxWait {
		t.Fatalf("first request: %+v, %v after %v; want degraded after the %v wait", res, err, took, wait)
	}
	// Each request waits until the first call has gone unanswered for
	// MaxTimeout: then Redis is down, and the errors stop growing.
	waittest.Until(t, 10*time.Second, "Redis marked down", func() bool {
		_, _, _ = l.Reserve(ctx, Key{Tenant: "t"}, lim, 0)
		return promtest.Value(t, reg, "kvgate_ratelimit_redis_up") == 0
	})
	if down := time.Since(start); down < maxWait {
		t.Errorf("Redis marked down %v after the first call, before MaxTimeout (%v): one slow answer took it out of use", down, maxWait)
	}
	waited := promtest.Value(t, reg, "kvgate_ratelimit_redis_errors_total")
	for range 100 {
		if res, _, err := l.Reserve(ctx, Key{Tenant: "t"}, lim, 0); err != nil || !res.Degraded {
			t.Fatalf("%+v, %v", res, err)
		}
	}
	if got := promtest.Value(t, reg, "kvgate_ratelimit_redis_errors_total"); got != waited {
		t.Errorf("%v more requests waited for Redis while it was down", got-waited)
	}
}

// TestSlowRedis: a Redis whose answers become slower than Timeout (a loaded
// server, a busy node) is slow, not down: after the first late answer the
// wait covers them, decisions come from Redis again, and it is never marked
// down — with FailClosed, only the requests that met the change get 503.
func TestSlowRedis(t *testing.T) {
	srv := redistest.Start(t)
	const delay = 120 * time.Millisecond
	p := delayProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	reg := prometheus.NewRegistry()
	l := New(c, Options{FailMode: FailClosed, Timeout: 50 * time.Millisecond, MaxTimeout: 2 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg)})
	ctx := context.Background()
	lim := Limits{RequestsPerMinute: 100000}
	reserve := func() (Result, error) {
		res, r, err := l.Reserve(ctx, Key{Tenant: "slow"}, lim, 0)
		_ = r.Cancel(ctx)
		return res, err
	}
	// Warm: the script loaded and a few pooled connections, as a replica
	// that has been serving has.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				if res, err := reserve(); err != nil || !res.Allowed {
					t.Errorf("with Redis fast: %+v, %v", res, err)
				}
			}
		})
	}
	wg.Wait()

	p.delay.Store(int64(delay))
	unavailable := 0
	for i := range 20 {
		res, err := reserve()
		switch {
		case errors.Is(err, ErrUnavailable):
			unavailable++
		case err != nil || !res.Allowed || res.Degraded:
			t.Fatalf("request %d: %+v, %v", i, res, err)
		}
		if promtest.Value(t, reg, "kvgate_ratelimit_redis_up") != 1 {
			t.Fatalf("request %d: Redis marked down though every call is answered in %v", i, delay)
		}
	}
	// The first waits 50 ms in vain, the second 100 ms (started 50 ms
	// later, its answer comes at 170); the third waits 200 ms and is answered.
	if unavailable > 2 {
		t.Errorf("%d of 20 requests refused with Redis answering every call in %v; the wait did not adapt (now %vs)",
			unavailable, delay, promtest.Value(t, reg, "kvgate_ratelimit_redis_wait_seconds"))
	}
	if w := promtest.Value(t, reg, "kvgate_ratelimit_redis_wait_seconds"); w < delay.Seconds() {
		t.Errorf("wait %vs, below the %v Redis takes", w, delay)
	}
}

type proxy struct {
	addr  string
	delay atomic.Int64 // ns each chunk of an answer is held
}

// delayProxy forwards TCP connections to addr, holding every chunk of the
// server's answers for the proxy's delay: a real Redis that answers slowly.
func delayProxy(t *testing.T, addr string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			stop := func() { _ = in.Close(); _ = out.Close() }
			wg.Go(func() { defer stop(); _, _ = io.Copy(out, in) })
			wg.Go(func() {
				defer stop()
				buf := make([]byte, 64<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

// netListen accepts connections on a loopback port and never answers them.
func netListen(t *testing.T) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String(), nil
}
