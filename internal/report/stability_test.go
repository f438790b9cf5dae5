package report

import (
	"testing"
	"time"
)

// trace makes n records arriving evenly over span, with the TTFT ttft(i, at).
func trace(n int, span time.Duration, ttft func(i int, at time.Duration) time.Duration) []Record {
	recs := make([]Record, n)
	for i := range recs {
		at := time.Duration(i) * span / time.Duration(n-1)
		recs[i] = Record{Arrival: at, TTFT: ttft(i, at), E2E: ttft(i, at) + time.Second, OutputTokens: 10, PromptTokens: 100}
	}
	return recs
}

func TestStability(t *testing.T) {
	const fast = 50 * time.Millisecond
	for _, tc := range []struct {
		name     string
		recs     []Record
		judged   bool
		unstable bool
	}{
		{"steady", trace(2000, time.Minute, func(int, time.Duration) time.Duration { return fast }), true, false},
		{"steady but slow everywhere, on a short trace", trace(200, 2*time.Second, func(int, time.Duration) time.Duration { return time.Second }), true, false},
		{"a third of requests on a server whose queue grows (each waits 2× its arrival time)",
			trace(3000, 200*time.Second, func(i int, at time.Duration) time.Duration {
				if i%3 == 0 {
					return 2 * at
				}
				return fast
			}), true, true},
		{"a queue that starts growing halfway", trace(3000, 200*time.Second, func(_ int, at time.Duration) time.Duration {
			return fast + max(0, at-100*time.Second)
		}), true, true},
		{"a queue that grows slowly (a tenth of the arrival time)", trace(3000, 200*time.Second, func(_ int, at time.Duration) time.Duration {
			return fast + at/10
		}), true, false},
		{"a burst that ends the trace and has not drained yet", trace(1200, 37*time.Second, func(_ int, at time.Duration) time.Duration {
			if at > 32*time.Second {
				return fast + at - 32*time.Second // up to a 5 s wait
			}
			return fast
		}), true, false},
		{"bursts that drain in between", trace(12000, 375*time.Second, func(_ int, at time.Duration) time.Duration {
			in := at % (30 * time.Second)
			if in < 5*time.Second {
				return fast + in
			}
			return fast
		}), true, false},
		{"too few requests to judge", trace(99, time.Minute, func(_ int, at time.Duration) time.Duration { return 10 * at }), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Summarize("s", "p", "sim", tc.recs)
			if (r.Drain != nil) != tc.judged || r.Unstable != tc.unstable {
				t.Fatalf("judged %v unstable %v (%+v), want judged %v unstable %v", r.Drain != nil, r.Unstable, r.Drain, tc.judged, tc.unstable)
			}
		})
	}
	t.Run("failed requests are not judged, and do not count", func(t *testing.T) {
		recs := trace(150, time.Minute, func(int, time.Duration) time.Duration { return fast })
		for i := range 60 {
			recs[i] = Record{Arrival: recs[i].Arrival, Error: true}
		}
		if r := Summarize("s", "p", "sim", recs); r.Drain != nil {
			t.Fatalf("90 successful requests judged: %+v", r.Drain)
		}
	})
}
