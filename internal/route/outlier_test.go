package route

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
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

// TestOutageEndsEjection: an endpoint ejected for the failures an outage
// caused (streams cut by a kill, before any scrape could tell) is back, its
// error rate forgotten, at the first healthy scrape once the fleet found it
// down, not when the ejection would have run out; without an outage seen in
// between, the ejection stands.
func TestOutageEndsEjection(t *testing.T) {
	for _, tc := range []struct {
		name string
		down bool // the fleet finds the endpoint unreachable after the failures
		back bool // then ejected no longer, its error rate 0
	}{
		{"killed and restarted", true, true},
		{"failing while its scrapes answer", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			g := newRouter(t, clk, testConfig(schedulerSpec("s", llama, "a:1", "b:1")))
			idle := engine.Metrics{NumBlocks: 1000}
			observe(g, clk, idle, "a:1", "b:1")
			r := pick(t, g, Request{Model: llama})
			for range 5 {
				r.Failed("a:1")
			}
			r.Finish(Outcome{Status: 200})
			view := func() (ejected bool, rate float64) {
				for _, e := range g.FleetView()[0].Endpoints {
					if e.Address == "a:1" {
						return e.EjectedForMs > 0, e.ErrorRate
					}
				}
				t.Fatal("a:1 not in the fleet view")
				return false, 0
			}
			if ejected, _ := view(); !ejected {
				t.Fatal("five failures in a row did not eject the endpoint")
			}
			clk.Advance(100 * time.Millisecond)
			if tc.down {
				for range 5 {
					g.fleet.ObserveResult("a:1", fleet.Result{Started: clk.Now(), Err: "connection refused", Unreachable: true})
				}
				clk.Advance(time.Second)
				pick(t, g, Request{Model: llama}).Finish(Outcome{Status: 200}) // the picker finds it down
			}
			clk.Advance(500 * time.Millisecond)
			observe(g, clk, idle, "a:1", "b:1")
			pick(t, g, Request{Model: llama}).Finish(Outcome{Status: 200})
			ejected, rate := view()
			if ejected == tc.back || (rate == 0) != tc.back {
				t.Errorf("after a healthy scrape: ejected %v, error rate %.3f; want back %v", ejected, rate, tc.back)
			}
		})
	}
}
