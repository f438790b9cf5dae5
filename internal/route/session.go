package route

import (
	"hash/maphash"
	"sync"
	"time"
)

// sessionMap remembers, per session key, the endpoint that served the session
// last, for sessionAffinity. Keys are kept hashed (a client's session ids are
// not held), entries expire ttl after their last use, and the map holds at
// most maxSessions: past that, a new session evicts expired ones, else an
// arbitrary one, looking at a bounded few.
type sessionMap struct {
	seed maphash.Seed
	mu   sync.Mutex
	ttl  time.Duration
	m    map[uint64]sessionEntry
}

type sessionEntry struct {
	addr    string
	expires time.Time
}

// maxSessions bounds a scheduler's session map: about 100 bytes an entry.
const maxSessions = 1 << 17

func newSessionMap(ttl time.Duration) *sessionMap {
	return &sessionMap{seed: maphash.MakeSeed(), ttl: ttl, m: map[uint64]sessionEntry{}}
}

func (s *sessionMap) hash(key string) uint64 { return maphash.String(s.seed, key) }

// get returns the endpoint that served key last, "" when none did within ttl.
func (s *sessionMap) get(key string, now time.Time) string {
	if key == "" {
		return ""
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[h]
	if !ok || now.After(e.expires) {
		return ""
	}
	return e.addr
}

// put records that addr serves key now.
func (s *sessionMap) put(key, addr string, now time.Time) {
	if key == "" {
		return
	}
	h := s.hash(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[h]; !ok && len(s.m) >= maxSessions {
		s.evict(now)
	}
	s.m[h] = sessionEntry{addr: addr, expires: now.Add(s.ttl)}
}

// evictScan bounds the entries a full map looks at to make room: a client
// sending new session keys as fast as it can costs each request this much,
// not a scan of the whole map.
const evictScan = 32

// evict makes room for one entry: the expired ones among up to evictScan
// (Go's map iteration starts at a random place), else the first one seen.
func (s *sessionMap) evict(now time.Time) {
	var first uint64
	seen, freed := 0, false
	for k, e := range s.m {
		if seen == 0 {
			first = k
		}
		if now.After(e.expires) {
			delete(s.m, k)
			freed = true
		}
		if seen++; seen == evictScan {
			break
		}
	}
	if !freed {
		delete(s.m, first)
	}
}

// setTTL applies a reloaded configuration's ttl from the next use on.
func (s *sessionMap) setTTL(ttl time.Duration) {
	s.mu.Lock()
	s.ttl = ttl
	s.mu.Unlock()
}
