package route

import (
	"strconv"
	"testing"
	"time"
)

func TestSessionMap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newSessionMap(time.Minute)
	s.put("a", "10.0.0.1:8000", t0)
	for _, tc := range []struct {
		name, key string
		at        time.Time
		want      string
	}{
		{"remembered", "a", t0.Add(30 * time.Second), "10.0.0.1:8000"},
		{"expired", "a", t0.Add(2 * time.Minute), ""},
		{"unknown", "b", t0, ""},
		{"no key", "", t0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.get(tc.key, tc.at); got != tc.want {
				t.Fatalf("get(%q) = %q, want %q", tc.key, got, tc.want)
			}
		})
	}
	t.Run("making room drops expired sessions before a live one", func(t *testing.T) {
		s := newSessionMap(time.Minute)
		for i := range evictScan - 1 {
			s.put("old-"+strconv.Itoa(i), "x", t0) // expired by t0+2m
		}
		s.put("live", "y", t0.Add(90*time.Second))
		s.evict(t0.Add(2 * time.Minute))
		if len(s.m) != 1 || s.get("live", t0.Add(2*time.Minute)) != "y" {
			t.Fatalf("after making room %d sessions are held, the live one %q", len(s.m), s.get("live", t0.Add(2*time.Minute)))
		}
	})
	t.Run("bounded", func(t *testing.T) {
		s := newSessionMap(time.Hour)
		for i := range maxSessions + 1000 {
			s.put(strconv.Itoa(i), "x", t0)
		}
		if n := len(s.m); n > maxSessions {
			t.Fatalf("%d sessions held, at most %d", n, maxSessions)
		}
		if got := s.get(strconv.Itoa(maxSessions+999), t0); got != "x" {
			t.Fatalf("the newest session was evicted")
		}
	})
}
