package latency

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestModelLearnsLine: a model fitted to noisy answers of a known line finds
// its coefficients, and a stall among them does not drag it away.
func TestModelLearnsLine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		truth  []float64
		noise  float64
		stalls bool
	}{
		{"fast pod", []float64{0.01, 0.05, 0.02}, 0.002, false},
		{"slow pod", []float64{0.05, 0.8, 0.1}, 0.02, false},
		{"slow pod with stalls", []float64{0.05, 0.8, 0.1}, 0.02, true},
		{"slow pod with stalls that hit several answers at once", []float64{0.05, 0.8, 0.1}, 0.02, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			m := New([]float64{0.01, 0.1, 0.05}, []float64{0.05, 2, 0.2})
			for i := range 400 {
				x := []float64{1, rng.Float64() * 4, rng.Float64() * 2}
				y := tc.truth[0] + tc.truth[1]*x[1] + tc.truth[2]*x[2] + rng.NormFloat64()*tc.noise
				clustered := strings.Contains(tc.name, "at once")
				if tc.stalls && (i%25 == 7 || clustered && i%25 < 7 && i%25 > 3) {
					y += 30 // answers stuck behind something else
				}
				m.Observe(x, y)
			}
			c := m.Coefficients()
			for i := range c {
				if math.Abs(c[i]-tc.truth[i]) > 0.1*tc.truth[1]+0.02 {
					t.Fatalf("coefficients %.4f, want about %.4f", c, tc.truth)
				}
			}
		})
	}
}

// TestModelNoticesSlowdown: when a pod's per-token cost doubles, the model
// follows: 60 answers later (0.95^60 ≈ 5% weight left on the old speed) it
// reads at least 80% of the change.
func TestModelNoticesSlowdown(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := New([]float64{0.01, 0.1, 0.05}, []float64{0.05, 2, 0.2})
	observe := func(perK float64, n int) {
		for range n {
			x := []float64{1, 0.5 + rng.Float64()*2, rng.Float64()}
			m.Observe(x, 0.01+perK*x[1]+0.02*x[2]+rng.NormFloat64()*0.005)
		}
	}
	observe(0.1, 200)
	if c := m.Coefficients()[1]; math.Abs(c-0.1) > 0.01 {
		t.Fatalf("per-token cost %.4f before the slowdown, want 0.1", c)
	}
	observe(0.2, 60)
	if c := m.Coefficients()[1]; c < 0.18 {
		t.Fatalf("per-token cost %.4f 60 answers after it doubled to 0.2", c)
	}
}

// TestModelIgnoresNonsense: NaN and infinite answers are not fitted, and a
// model of unvarying inputs stays finite.
func TestModelIgnoresNonsense(t *testing.T) {
	m := New([]float64{0.01, 0.1, 0.05}, []float64{0.05, 2, 0.2})
	m.Observe([]float64{1, 1, 0}, math.NaN())
	m.Observe([]float64{1, 1, 0}, math.Inf(1))
	if m.Samples != 0 {
		t.Fatalf("fitted %d nonsense answers", m.Samples)
	}
	m.Observe([]float64{1, 1e200, 0}, 1)  // a server's nonsense gauge
	m.Observe([]float64{1, 1, 0}, -1e300) // and time
	if m.Samples != 0 {
		t.Fatalf("fitted %d absurd answers", m.Samples)
	}
	for range 10000 {
		m.Observe([]float64{1, 0.5, 0}, 0.06)
	}
	for _, c := range m.Coefficients() {
		if math.IsNaN(c) || math.IsInf(c, 0) || math.Abs(c) > 10 {
			t.Fatalf("coefficients %v after unvarying inputs", m.Coefficients())
		}
	}
	if got := m.Predict([]float64{1, 0.5, 0}); math.Abs(got-0.06) > 0.005 {
		t.Fatalf("predicts %.4f for the input it saw 10,000 times with 0.06", got)
	}
}

// TestTrackerBorrowsUntilLearned: an endpoint with fewer than MinSamples
// answers reads as its pool's median; then as itself.
func TestTrackerBorrowsUntilLearned(t *testing.T) {
	prior := Speed{Base: 0.02, PerKToken: 0.3, PerKTokenQueued: 0.3, PerRunning: 0.001, StepBase: 0.03, StepPerRunning: 0.0003, MeanPrefillTokens: 700, Samples: 3}
	var tr Tracker
	if s := tr.Speed(prior); !s.Borrowed || s.PerKToken != 0.3 || s.Samples != 0 {
		t.Fatalf("a tracker that learned nothing reads %+v", s)
	}
	for i := range MinSamples {
		// Before a fit of its own, the pool's shape at the pace its answers
		// showed: each of 0.5 s where the pool predicts 0.02 + 0.3 × 0.512.
		pace := 1.0
		if i > 0 {
			pace = 0.5 / prior.TTFT(512, 0, 0, 0)
		}
		if s := tr.Speed(prior); !s.Borrowed || math.Abs(s.PerKToken-0.3*pace) > 1e-9 || math.Abs(s.Pace-pace) > 1e-9 {
			t.Fatalf("after %d answers it reads %+v, want the prior's at pace %.3f", i, s, pace)
		}
		// 512 tokens in 0.5 s: about a second per thousand tokens.
		tr.ObserveTTFT(512, 0, 0, 0, 0.5, prior)
	}
	s := tr.Speed(prior)
	if s.Borrowed || s.Samples != MinSamples || s.PerKToken < 0.5 {
		t.Fatalf("after %d answers of a slow pod it reads %+v", MinSamples, s)
	}
	if got := s.TTFT(512, 0, 0, 0); math.Abs(got-0.5) > 0.15 {
		t.Fatalf("predicts %.3f s for the 512 tokens that took 0.5 s", got)
	}
}

func TestMedian(t *testing.T) {
	if got := Median(nil); got != Default {
		t.Fatalf("median of nothing %+v, want the default", got)
	}
	speeds := []Speed{{PerKToken: 0.1}, {PerKToken: 0.5}, {PerKToken: 0.2}, {PerKToken: 9, Borrowed: true}}
	if got := Median(speeds); got.PerKToken != 0.2 || got.Samples != 3 {
		t.Fatalf("median %+v, want per-token 0.2 over 3 learned speeds", got)
	}
}

// TestTTFTGrowsWithWork: whatever the fit, queueing more on an endpoint never
// makes it look faster.
func TestTTFTGrowsWithWork(t *testing.T) {
	s := Speed{Base: 0.3, PerKToken: -0.2, PerKTokenQueued: -0.2, PerRunning: -1}
	if a, b := s.TTFT(500, 1000, 4, 0), s.TTFT(500, 2000, 4, 0); !(b > a) || a < 0 {
		t.Fatalf("TTFT(1000) %.4f, TTFT(2000) %.4f", a, b)
	}
}

// TestPace: like pods read alike however their own fits wander, and a pod of
// a slower generation reads as slow as its answers are.
func TestPace(t *testing.T) {
	pool := Speed{Base: 0.01, PerKToken: 0.05, PerKTokenQueued: 0.02, PerRunning: 0.0002, MeanPrefillTokens: 512}
	truth := func(slow, own, ahead, running float64) float64 {
		return slow * (0.01 + 0.05*own/1000 + 0.02*ahead/1000 + 0.0002*running)
	}
	tests := []struct {
		name string
		slow float64
	}{
		{"like the pool", 1},
		{"ten times slower", 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a, b Tracker
			rng := rand.New(rand.NewPCG(1, 2))
			for range 200 {
				own, ahead, running := 100+rng.Float64()*900, rng.Float64()*4000, rng.Float64()*50
				// ±30% noise: queueing the features do not capture.
				noise := func() float64 { return 0.7 + 0.6*rng.Float64() }
				a.ObserveTTFT(own, ahead, running, 0, truth(tc.slow, own, ahead, running)*noise(), pool)
				b.ObserveTTFT(own, ahead, running, 0, truth(tc.slow, own, ahead, running)*noise(), pool)
			}
			for _, tr := range []*Tracker{&a, &b} {
				s := tr.Speed(pool)
				if s.Pace < 0.8*tc.slow || s.Pace > 1.25*tc.slow {
					t.Errorf("pace %.2f, want about %g", s.Pace, tc.slow)
				}
				for _, w := range []struct{ own, ahead, running float64 }{{512, 0, 0}, {512, 8000, 20}} {
					want := truth(tc.slow, w.own, w.ahead, w.running)
					if got := s.TTFT(w.own, w.ahead, w.running, 0); got < 0.6*want || got > 1.6*want {
						t.Errorf("predicts %.4f s for %+v, want about %.4f", got, w, want)
					}
				}
			}
			pa, pb := a.Speed(pool).TTFT(512, 4000, 20, 0), b.Speed(pool).TTFT(512, 4000, 20, 0)
			if r := pa / pb; r < 0.8 || r > 1.25 {
				t.Errorf("two pods alike predict %.4f and %.4f s for the same work", pa, pb)
			}
		})
	}
}

// TestForgetTTFT: a tracker that forgot its time-to-first-token model borrows
// its prior's again, keeps its step model, and learns anew from the next
// answers at full weight.
func TestForgetTTFT(t *testing.T) {
	prior := Speed{Base: 0.01, PerKToken: 0.1, PerKTokenQueued: 0.1, PerRunning: 0.0005, StepBase: 0.02, MeanPrefillTokens: 512}
	var tr Tracker
	for range 20 {
		tr.ObserveTTFT(2000, 0, 0, 0, 10, prior) // 50× the prior's 0.21 s
		tr.ObserveStep(0, 0.05, prior)
	}
	tr.ForgetTTFT()
	s := tr.Speed(prior)
	if !s.Borrowed || s.Samples != 0 || s.TTFT(2000, 0, 0, 0) != prior.TTFT(2000, 0, 0, 0) || s.Steps != 20 || s.StepBase < 0.04 {
		t.Fatalf("after ForgetTTFT it reads %+v; want the prior's TTFT and its own 20 steps", s)
	}
	for range MinSamples {
		tr.ObserveTTFT(2000, 0, 0, 0, 0.4, prior)
	}
	if got := tr.Speed(prior).TTFT(2000, 0, 0, 0); got < 0.3 || got > 0.5 {
		t.Errorf("after %d answers of 0.4 s it predicts %.2f s", MinSamples, got)
	}
}
