package auth

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Failed authentications are bounded per client address, so that guessing
// keys or tokens costs time: past ThrottleFailures refusals of credentials
// that do not verify (Reason.guess) within ThrottleWindow from one address, its requests are refused with 429 and
// Retry-After, before any credential is verified, until the window ends.
// The window starts at an address's first refusal (fail2ban's findtime, with
// a bound far above what a client with a stale key reaches by its retries).
const (
	ThrottleFailures = 20
	ThrottleWindow   = time.Minute
	// ThrottleAddresses bounds the table (about 100 bytes an address): when
	// it is full, windows that ended are dropped, then an address at random.
	ThrottleAddresses = 10_000
)

// throttle counts the failed authentications of each client address.
type throttle struct {
	now func() time.Time

	mu    sync.Mutex
	seen  map[netip.Prefix]*strikes
	swept time.Time // the last sweep of a full table for ended windows
}

// strikes are an address's refusals in its current window.
type strikes struct {
	since time.Time
	n     int
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, seen: map[netip.Prefix]*strikes{}}
}

// clientKey is what the table counts for a client address (host:port or a
// bare address): the address, or its /64 for IPv6, the block a single host
// is usually given. ok is false for an address that does not parse (a Unix
// socket, none): such requests are not throttled.
func clientKey(addr string) (netip.Prefix, bool) {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.WithZone("").Prefix(bits)
	return p, err == nil
}

// wait says how long the client at key is still refused, 0 when it is not
// (or has no key).
func (t *throttle) wait(key netip.Prefix, keyed bool) time.Duration {
	if !keyed {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.seen[key]
	if s == nil || s.n < ThrottleFailures {
		return 0
	}
	left := s.since.Add(ThrottleWindow).Sub(t.now())
	if left <= 0 {
		delete(t.seen, key)
		return 0
	}
	return left
}

// failed counts a refusal of the client at key.
func (t *throttle) failed(key netip.Prefix) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if s := t.seen[key]; s != nil && now.Sub(s.since) < ThrottleWindow {
		s.n++
		return
	}
	if _, ok := t.seen[key]; !ok && len(t.seen) >= ThrottleAddresses {
		t.evict(now)
	}
	t.seen[key] = &strikes{since: now, n: 1}
}

// evict makes room in a full table: the windows that ended go (looked for
// at most once a second, the sweep costing a pass over the table), or else
// one address at random (map order), so that a flood of new addresses cannot
// grow it.
func (t *throttle) evict(now time.Time) {
	if now.Sub(t.swept) >= time.Second {
		t.swept = now
		for k, s := range t.seen {
			if now.Sub(s.since) >= ThrottleWindow {
				delete(t.seen, k)
			}
		}
		if len(t.seen) < ThrottleAddresses {
			return
		}
	}
	for k := range t.seen {
		delete(t.seen, k)
		return
	}
}
