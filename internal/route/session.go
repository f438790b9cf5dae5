package route

import (
	"hash/maphash"
	"sync"
	"time"
)

// sessionMap remembers, per session key, the endpoint that served the session
// last, for sessionAffinity. Keys are kept hashed (a client's session ids are
// not held), entries expire ttl after their last use, and the map holds at
// most maxSessions: past that, a new session evicts expired ones first, then
// an arbitrary one.
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
		for k, e := range s.m {
			if now.After(e.expires) {
				delete(s.m, k)
			}
		}
		for k := range s.m {
			if len(s.m) < maxSessions {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[h] = sessionEntry{addr: addr, expires: now.Add(s.ttl)}
}

// setTTL applies a reloaded configuration's ttl from the next use on.
func (s *sessionMap) setTTL(ttl time.Duration) {
	s.mu.Lock()
	s.ttl = ttl
	s.mu.Unlock()
}
