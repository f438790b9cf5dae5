package ratelimit

import (
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The arithmetic is written twice, in Lua for Redis and in Go for the local
// fallback; the two must stay line for line alike (the tests run every case
// against both). All times are float64 microseconds.
//
// A dimension's state is its debt d = TAT − t: how far its theoretical arrival
// time lies beyond the instant t of the last update. Storing the debt rather
// than the TAT keeps the numbers below ~1e8 µs, where a float64 resolves
// 1e-8 µs, instead of absolute timestamps (~1.8e15 µs, resolved to 0.25 µs),
// whose rounding of a non-integral interval, repeated over a minute's burst,
// can add up to a whole request at the boundary.
const (
	// window is the GCRA tolerance τ = burst × interval. With the burst set to
	// the per-minute limit it is one minute whatever the limit.
	window = 60e6
	// slack absorbs the rounding of summed float intervals, so that exactly
	// `limit` units fit in the window (1 ns of allowance: far below one unit
	// for any limit under 6e10 per minute).
	slack = 0.001
)

// dim is one dimension of a check.
type dim struct {
	interval float64 // µs of allowance per unit (60 s / limit); 0 = unlimited
	cost     float64 // units this check takes: 1 request, or the reserved tokens
}

func newDim(perMinute, cost int64) dim {
	if perMinute <= 0 {
		return dim{}
	}
	return dim{interval: window / float64(perMinute), cost: float64(cost)}
}

// decision is one check's outcome, in the units the script returns.
type decision struct {
	denied int64 // bit 1: requests refused, bit 2: tokens refused; 0 = allowed
	retry  int64 // µs until a retry of the same check would conform
	dims   [2]dimResult
}

type dimResult struct {
	remaining int64 // whole units left after the decision; -1 when unlimited
	reset     int64 // µs until the dimension is idle (its debt repaid)
}

// decide is the GCRA step for both dimensions at once, given their debts
// already decayed to now. It returns the debts to store when allowed.
func decide(debt [2]float64, dims [2]dim) (decision, [2]float64) {
	var out decision
	var need [2]float64
	for i, d := range dims {
		if d.interval <= 0 {
			continue
		}
		need[i] = debt[i] + d.cost*d.interval
		if need[i] > window+slack {
			out.denied |= 1 << i
			out.retry = max(out.retry, int64(math.Ceil(need[i]-window)))
		}
	}
	after := debt
	for i, d := range dims {
		if d.interval <= 0 {
			out.dims[i] = dimResult{remaining: -1}
			continue
		}
		if out.denied == 0 {
			after[i] = need[i]
		}
		rem := max(math.Floor((window+slack-after[i])/d.interval), 0)
		// (less the slack, so that a full burst resets in a minute, not a
		// minute and a microsecond of rounding)
		out.dims[i] = dimResult{remaining: int64(rem), reset: int64(math.Ceil(after[i] - slack))}
	}
	return out, after
}

// luaPrelude holds what both scripts share: Redis's clock, and reading and
// writing a debt. A key is a hash {t = µs of Redis time at the last update,
// d = debt at t}; it expires when the debt is repaid, since a missing key and
// an idle one mean the same.
const luaPrelude = `
if redis.replicate_commands then redis.replicate_commands() end
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])

local function debt(key)
  local s = redis.call('HMGET', key, 't', 'd')
  local t, d = tonumber(s[1]), tonumber(s[2])
  if not t or not d then return 0 end
  local elapsed = now - t
  if elapsed < 0 then elapsed = 0 end
  d = d - elapsed
  if d < 0 then return 0 end
  return d
end

local function store(key, d)
  if d <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 't', string.format('%.17g', now), 'd', string.format('%.17g', d))
  redis.call('PEXPIRE', key, math.ceil(d / 1000))
end
`

// reserveScript is decide() in Lua.
// KEYS: request state, token state.
// ARGV: request interval, request cost, token interval, token cost, window, slack.
// Returns {denied, retry, request remaining, request reset, token remaining, token reset}.
var reserveScript = redis.NewScript(luaPrelude + `
local win, slack = tonumber(ARGV[5]), tonumber(ARGV[6])
local denied, retry = 0, 0
local iv, cost, debts, need = {}, {}, {}, {}
for i = 1, 2 do
  iv[i], cost[i] = tonumber(ARGV[2*i-1]), tonumber(ARGV[2*i])
  if iv[i] > 0 then
    debts[i] = debt(KEYS[i])
    need[i] = debts[i] + cost[i] * iv[i]
    if need[i] > win + slack then
      denied = denied + i
      local r = math.ceil(need[i] - win)
      if r > retry then retry = r end
    end
  end
end
local out = {denied, retry}
for i = 1, 2 do
  if iv[i] > 0 then
    local after = debts[i]
    if denied == 0 then
      after = need[i]
      if cost[i] > 0 then store(KEYS[i], after) end
    end
    local rem = math.floor((win + slack - after) / iv[i])
    if rem < 0 then rem = 0 end
    out[#out+1] = rem
    out[#out+1] = math.ceil(after - slack)
  else
    out[#out+1] = -1
    out[#out+1] = 0
  end
end
return out
`)

// adjustScript moves the debts of a reservation after the fact: ARGV holds
// signed µs for the request and the token key (0 leaves a key alone). A refund
// never takes the debt below zero, i.e. the TAT before now.
var adjustScript = redis.NewScript(luaPrelude + `
for i = 1, 2 do
  local delta = tonumber(ARGV[i])
  if delta ~= 0 then store(KEYS[i], debt(KEYS[i]) + delta) end
end
return {1}
`)

// localStore is the same GCRA in process memory: the fail-open fallback, and
// the whole limiter when there is no Redis.
type localStore struct {
	now  func() time.Time
	base time.Time // µs are counted from here (monotonic)

	mu    sync.Mutex
	debts map[string]debtAt
	swept int64 // µs of the last sweep of repaid entries
}

type debtAt struct {
	t int64   // µs since base
	d float64 // debt at t
}

func newLocalStore(now func() time.Time) *localStore {
	return &localStore{now: now, base: now(), debts: map[string]debtAt{}}
}

func (s *localStore) micros() int64 { return s.now().Sub(s.base).Microseconds() }

// debt mirrors the Lua debt(); s.mu is held.
func (s *localStore) debt(key string, now int64) float64 {
	st, ok := s.debts[key]
	if !ok {
		return 0
	}
	return max(st.d-float64(max(now-st.t, 0)), 0)
}

// store mirrors the Lua store(); s.mu is held.
func (s *localStore) store(key string, now int64, d float64) {
	if d <= 0 {
		delete(s.debts, key)
		return
	}
	s.debts[key] = debtAt{t: now, d: d}
}

func (s *localStore) reserve(keys [2]string, dims [2]dim) decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	s.sweep(now)
	var debts [2]float64
	for i, d := range dims {
		if d.interval > 0 {
			debts[i] = s.debt(keys[i], now)
		}
	}
	out, after := decide(debts, dims)
	if out.denied == 0 {
		for i, d := range dims {
			if d.interval > 0 && d.cost > 0 {
				s.store(keys[i], now, after[i])
			}
		}
	}
	return out
}

func (s *localStore) adjust(keys [2]string, deltas [2]float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.micros()
	for i, delta := range deltas {
		if delta != 0 {
			s.store(keys[i], now, s.debt(keys[i], now)+delta)
		}
	}
}

// sweep drops repaid entries once per window, the local counterpart of the
// keys' expiry, so that the map holds only the keys active in the last minute
// or so; s.mu is held.
func (s *localStore) sweep(now int64) {
	if now-s.swept < window {
		return
	}
	s.swept = now
	for k := range s.debts {
		if s.debt(k, now) == 0 {
			delete(s.debts, k)
		}
	}
}

// size is the number of keys held, for tests.
func (s *localStore) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.debts)
}
