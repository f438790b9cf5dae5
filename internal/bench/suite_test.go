package bench

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/workload"
)

// The suite keeps its scenarios, adds a version of mixed-gpu and bursty at
// which every baseline drains, and states every target it can as goals.
func TestSuite(t *testing.T) {
	for _, quick := range []bool{false, true} {
		sc, err := Suite("aws", quick)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range sc {
			names = append(names, s.Name)
			if s.Target != "" && len(s.Goals) == 0 {
				t.Errorf("%s: target %q without goals", s.Name, s.Target)
			}
			for _, g := range s.Goals {
				if g.Percentile != 95 && g.Percentile != 99 || g.Against != "" && !slices.Contains(Policies, g.Against) {
					t.Errorf("%s: goal %+v", s.Name, g)
				}
			}
		}
		want := "mixed-gpu,mixed-gpu-stable,bursty,bursty-ttft,shared-prefix,uniform-steady,lora-heavy,long-context"
		if strings.Join(names, ",") != want {
			t.Fatalf("quick %v: scenarios %v, want %s", quick, names, want)
		}
	}
	sc, _ := Suite("aws", false)
	byName := map[string]Scenario{}
	for _, s := range sc {
		byName[s.Name] = s
	}
	t.Run("mixed-gpu-stable: what round-robin sends an A10G is below what it sustains", func(t *testing.T) {
		s := byName["mixed-gpu-stable"]
		if perServer := s.Workload.Rate / 8; perServer >= a10gRate || s.Workload.Rate > 13 {
			t.Fatalf("%g requests/s, %g an A10G", s.Workload.Rate, perServer)
		}
		if !strings.Contains(byName["mixed-gpu"].Description, "overloads round-robin") {
			t.Fatalf("mixed-gpu's description does not say it overloads round-robin: %s", byName["mixed-gpu"].Description)
		}
	})
	t.Run("bursty-ttft: 10 s bursts at 1.5× the fleet's capacity", func(t *testing.T) {
		w := byName["bursty-ttft"].Workload
		on, off := w.BurstOn.Seconds(), w.BurstOff.Seconds()
		burst := w.BurstFactor * w.Rate * (on + off) / (w.BurstFactor*on + off)
		if on != 10 || math.Abs(burst/(4*h100x4Rate70b)-1.5) > 1e-9 {
			t.Fatalf("bursts of %gs at %g requests/s", on, burst)
		}
		tr, err := workload.Generate(w)
		if err != nil {
			t.Fatal(err)
		}
		// Over the whole cycles of the trace (it starts with a burst).
		cycles := math.Floor(tr[len(tr)-1].At / (on + off))
		n := 0
		for _, q := range tr {
			if q.At < cycles*(on+off) && math.Mod(q.At, on+off) < on {
				n++
			}
		}
		if got := float64(n) / (cycles * on); math.Abs(got/burst-1) > 0.05 {
			t.Fatalf("the trace's bursts arrive at %.1f requests/s, want %.1f", got, burst)
		}
	})
}

// A scenario whose A10G round-robin overloads is flagged unstable under
// round-robin, not under kvgate, which sends the A10G what it can take; at a
// load round-robin sustains, nothing is flagged.
func TestUnstableFlagged(t *testing.T) {
	fleet := mixedFleet()
	for _, tc := range []struct {
		name     string
		rate     float64
		policy   string
		unstable bool
	}{
		{"overloaded A10Gs under round-robin", 92, "round-robin", true},
		{"the same traffic under kvgate", 92, "kvgate", false},
		{"a load round-robin sustains", 8, "round-robin", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := workload.Generate(workload.Spec{Kind: "poisson", Seed: 5, Requests: 1500, Rate: tc.rate})
			if err != nil {
				t.Fatal(err)
			}
			recs, _, err := RunSim(context.Background(), SimOptions{Fleet: fleet, Policy: tc.policy, Seed: 1}, tr)
			if err != nil {
				t.Fatal(err)
			}
			r := report.Summarize("s", tc.policy, "sim", recs)
			if r.Drain == nil || r.Unstable != tc.unstable {
				t.Fatalf("unstable %v (%+v, P95 %.0f ms), want %v", r.Unstable, r.Drain, r.TTFTP95ms, tc.unstable)
			}
		})
	}
}
