package global

import (
	"math/rand/v2"
	"testing"
	"time"
)

// share counts, over n draws, how often each candidate is ranked first.
func share(cands []Candidate, p Policy, n int) map[string]float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	count := map[string]float64{}
	for range n {
		r := Rank(cands, p, rng.Float64)
		count[cands[r[0]].Name] += 1.0 / float64(n)
	}
	return count
}

func TestRank(t *testing.T) {
	slo := time.Second
	cheap := Candidate{Name: "cheap", Price: 1, Weight: 1, Ramp: 1, Region: "us"}
	dear := Candidate{Name: "dear", Price: 3, Weight: 1, Ramp: 1, Region: "us"}
	with := func(c Candidate, f func(*Candidate)) Candidate { f(&c); return c }
	busy := func(p95 time.Duration) func(*Candidate) {
		return func(c *Candidate) { c.TTFTP50, c.TTFTP95, c.Samples = p95, p95, 100 }
	}
	for _, tc := range []struct {
		name   string
		cands  []Candidate
		policy Policy
		// want is each member's share of first picks, ± 0.03
		want map[string]float64
	}{
		{"cheap inside its SLO takes everything", []Candidate{dear, with(cheap, busy(500*time.Millisecond))}, Policy{SLO: slo},
			map[string]float64{"cheap": 1}},
		{"cheap at the SLO spills half", []Candidate{dear, with(cheap, busy(slo))}, Policy{SLO: slo},
			map[string]float64{"cheap": 0.5, "dear": 0.5}},
		{"cheap far over its SLO spills all", []Candidate{dear, with(cheap, busy(2*slo))}, Policy{SLO: slo},
			map[string]float64{"dear": 1}},
		{"everyone over the SLO: the fastest", []Candidate{with(dear, busy(3*slo)), with(cheap, busy(2*slo))}, Policy{SLO: slo},
			map[string]float64{"cheap": 1}},
		{"queue counts before the window shows it", []Candidate{dear, with(cheap, func(c *Candidate) { busy(300 * time.Millisecond)(c); c.WaitingPerEndpoint = 4 })}, Policy{SLO: slo},
			map[string]float64{"dear": 1}},
		{"requests sent since the last summary count", []Candidate{dear, with(cheap, func(c *Candidate) { busy(300 * time.Millisecond)(c); c.SentPerEndpoint = 8 })}, Policy{SLO: slo},
			map[string]float64{"dear": 1}},
		{"price-blind splits by weight", []Candidate{with(dear, func(c *Candidate) { c.Weight = 3 }), cheap}, Policy{SLO: slo, PriceBlind: true},
			map[string]float64{"dear": 0.75, "cheap": 0.25}},
		{"equal prices split by weight", []Candidate{with(cheap, func(c *Candidate) { c.Name, c.Weight = "a", 2 }), with(cheap, func(c *Candidate) { c.Name = "b" })}, Policy{SLO: slo},
			map[string]float64{"a": 2.0 / 3, "b": 1.0 / 3}},
		{"ramping cheap member takes its ramp's share", []Candidate{dear, with(cheap, func(c *Candidate) { c.Ramp = 0.25 })}, Policy{SLO: slo},
			map[string]float64{"cheap": 0.25, "dear": 0.75}},
		{"a ramping member is not the stampede's target when the others pass", []Candidate{with(dear, busy(slo*3/20)), with(cheap, func(c *Candidate) { c.Ramp = 0.1 })},
			Policy{SLO: slo / 10}, map[string]float64{"cheap": 0.1, "dear": 0.9}},
		{"same-tier ramp: its share of the tier", []Candidate{with(cheap, func(c *Candidate) { c.Name, c.Ramp = "back", 0.2 }), cheap}, Policy{SLO: slo},
			map[string]float64{"back": 0.1, "cheap": 0.9}},
		{"same price: the client's region first", []Candidate{with(cheap, func(c *Candidate) { c.Name, c.Region = "eu", "eu" }), cheap}, Policy{SLO: slo, ClientRegion: "us", CrossRegion: 100 * time.Millisecond},
			map[string]float64{"cheap": 1}},
		{"failing member last", []Candidate{dear, with(cheap, func(c *Candidate) { c.ErrorRate, c.Requests = 0.5, 100 })}, Policy{SLO: slo, MaxErrorRate: 0.2},
			map[string]float64{"dear": 1}},
		{"an error rate on few requests does not count", []Candidate{dear, with(cheap, func(c *Candidate) { c.ErrorRate, c.Requests = 1, 3 })}, Policy{SLO: slo, MaxErrorRate: 0.2},
			map[string]float64{"cheap": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := share(tc.cands, tc.policy, 4000)
			for name, want := range tc.want {
				if d := got[name] - want; d > 0.03 || d < -0.03 {
					t.Errorf("%s first in %.2f of picks, want %.2f (all: %v)", name, got[name], want, got)
				}
			}
		})
	}
}

// TestRankFallbacks: every candidate appears once; fallbacks go fastest first,
// failing members last.
func TestRankFallbacks(t *testing.T) {
	cands := []Candidate{
		{Name: "slow", Price: 1, Weight: 1, Ramp: 1, TTFTP50: 5 * time.Second, Samples: 50},
		{Name: "failing", Price: 2, Weight: 1, Ramp: 1, ErrorRate: 0.9, Requests: 50},
		{Name: "fast", Price: 3, Weight: 1, Ramp: 1, TTFTP50: 100 * time.Millisecond, Samples: 50},
		{Name: "mid", Price: 4, Weight: 1, Ramp: 1, TTFTP50: 800 * time.Millisecond, Samples: 50},
	}
	r := Rank(cands, Policy{SLO: time.Second, MaxErrorRate: 0.2}, rand.New(rand.NewPCG(3, 4)).Float64)
	var names []string
	for _, i := range r {
		names = append(names, cands[i].Name)
	}
	if len(names) != 4 || names[0] != "fast" || names[1] != "mid" || names[2] != "slow" || names[3] != "failing" {
		t.Fatalf("order %v, want fast (cheapest inside the SLO), mid, slow, failing", names)
	}
	if Rank(nil, Policy{}, rand.Float64) != nil {
		t.Fatal("no candidates, no ranking")
	}
}
