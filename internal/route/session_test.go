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
