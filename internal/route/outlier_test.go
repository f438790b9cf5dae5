package route

import (
	"math"
	"testing"
	"time"
)

// TestErrorRate: the failure share follows the recent answers and fades while
// none come, so a pod passed over for its failures is tried again.
func TestErrorRate(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	near := func(got, want float64) bool { return math.Abs(got-want) < 0.01 }
	for _, tc := range []struct {
		name    string
		answers []bool // failed?
		after   time.Duration
		want    float64
	}{
		{"never failed", []bool{false, false, false}, 0, 0},
		{"one failure", []bool{true}, 0, 0.1},
		{"every answer failed", repeat(true, 60), 0, 1},
		{"three in ten", repeat3in10(200), 0, 0.3},
		{"faded after one half-life", repeat(true, 60), errorRateHalfLife, 0.5},
		{"faded after three", repeat(true, 60), 3 * errorRateHalfLife, 0.125},
		{"recovers with good answers", append(repeat(true, 60), repeat(false, 40)...), 0, 0.015},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &endpoint{addr: "a"}
			now := t0
			for _, failed := range tc.answers {
				e.noteAnswer(now, failed)
			}
			got := e.errorRate(now.Add(tc.after))
			if tc.name == "three in ten" {
				// A mean over about 20 answers swings around the share.
				if got < 0.15 || got > 0.45 {
					t.Errorf("rate %.3f, want about %.2f", got, tc.want)
				}
				return
			}
			if !near(got, tc.want) {
				t.Errorf("rate %.3f, want %.3f", got, tc.want)
			}
		})
	}
}

func repeat(failed bool, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = failed
	}
	return out
}

func repeat3in10(n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = i%10 < 3
	}
	return out
}
