package route

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestErrorRate: the failure share follows the recent answers and fades while
// none come, so a pod passed over for its failures is tried again.
func TestErrorRate(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	threeInTen := slices.Repeat(append(slices.Repeat([]bool{true}, 3), slices.Repeat([]bool{false}, 7)...), 20)
	for _, tc := range []struct {
		name    string
		answers []bool // failed?
		after   time.Duration
		want    float64
		tol     float64 // a mean over about 20 answers swings around a steady share
	}{
		{"never failed", []bool{false, false, false}, 0, 0, 0.01},
		{"one failure", []bool{true}, 0, 0.1, 0.01},
		{"every answer failed", slices.Repeat([]bool{true}, 60), 0, 1, 0.01},
		{"three in ten", threeInTen, 0, 0.3, 0.15},
		{"faded after one half-life", slices.Repeat([]bool{true}, 60), errorRateHalfLife, 0.5, 0.01},
		{"faded after three", slices.Repeat([]bool{true}, 60), 3 * errorRateHalfLife, 0.125, 0.01},
		{"recovers with good answers", append(slices.Repeat([]bool{true}, 60), slices.Repeat([]bool{false}, 40)...), 0, 0.015, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &endpoint{addr: "a"}
			for _, failed := range tc.answers {
				e.noteAnswer(t0, failed)
			}
			if got := e.errorRate(t0.Add(tc.after)); math.Abs(got-tc.want) > tc.tol {
				t.Errorf("rate %.3f, want %.3f ± %.2f", got, tc.want, tc.tol)
			}
		})
	}
}
