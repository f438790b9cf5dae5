package schedule

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// TestScorerRegistry: each scorer is registered once, builds a scorer of its
// own name, says what it does, and is a weight of the configuration, as every
// weight of the configuration is a scorer: a scorer cannot be half added.
func TestScorerRegistry(t *testing.T) {
	fields := slices.Collect(maps.Keys((v1alpha1.Weights{}).ByName()))
	seen := map[v1alpha1.ScorerName]bool{}
	for _, s := range Scorers() {
		t.Run(string(s.Name), func(t *testing.T) {
			if seen[s.Name] {
				t.Fatal("registered twice")
			}
			seen[s.Name] = true
			if got := s.New(Profile{}).Name(); got != s.Name {
				t.Errorf("New builds %q", got)
			}
			if s.Description == "" {
				t.Error("no description")
			}
			if got, ok := LookupScorer(s.Name); !ok || got.Name != s.Name {
				t.Errorf("LookupScorer: %q %v", got.Name, ok)
			}
			if !slices.Contains(fields, s.Name) {
				t.Error("no field of v1alpha1.Weights (ByName) sets its weight")
			}
			if _, ok := (Scores{}).Get(string(s.Name)); ok {
				t.Error("an empty Scores holds its score")
			}
		})
	}
	for _, f := range fields {
		if !seen[f] {
			t.Errorf("v1alpha1.Weights sets %q, which no scorer is", f)
		}
	}
	if _, ok := LookupScorer("fastest"); ok {
		t.Error("an unknown scorer resolved")
	}
}

func TestFilterRegistry(t *testing.T) {
	seen := map[FilterName]bool{}
	for _, f := range Filters() {
		t.Run(string(f.Name), func(t *testing.T) {
			if seen[f.Name] || f.Description == "" || f.keep == nil {
				t.Errorf("registered twice, or without a description or a function: %+v", f)
			}
			seen[f.Name] = true
		})
	}
	if len(seen) != len(filters) {
		t.Errorf("%d filters, %d names", len(filters), len(seen))
	}
}

// TestProfileRegistry: every profile resolves, weighs only registered
// scorers, and the default's alias is the default profile.
func TestProfileRegistry(t *testing.T) {
	seen := map[v1alpha1.ProfileName]bool{}
	for _, p := range Profiles() {
		t.Run(string(p.Name), func(t *testing.T) {
			if seen[p.Name] || p.Description == "" {
				t.Errorf("registered twice, or without a description: %+v", p)
			}
			seen[p.Name] = true
			got, err := LookupProfile(string(p.Name))
			if err != nil || !got.Equal(p.Profile) {
				t.Fatalf("LookupProfile: %+v %v, registered %+v", got, err, p.Profile)
			}
			if len(p.Profile.Weights) == 0 {
				t.Error("no weights")
			}
			for n := range p.Profile.Weights {
				if _, ok := LookupScorer(n); !ok {
					t.Errorf("weighs %q, which no scorer is", n)
				}
			}
		})
	}
	def, _ := LookupProfile(string(DefaultProfile))
	if alias, _ := LookupProfile(string(v1alpha1.ProfileKvgate)); !alias.Equal(def) {
		t.Errorf("%s is %+v, the default %+v", v1alpha1.ProfileKvgate, alias, def)
	}
	if _, err := LookupProfile("fastest"); err == nil {
		t.Error("an unknown profile resolved")
	}
}

func TestUsesPrefix(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    Weights
		want bool
	}{
		{"gie-default", GIEDefault, true},
		{"load only", Weights{v1alpha1.ScorerQueue: 1, v1alpha1.ScorerKVCache: 1}, false},
		{"prefix weighed 0", Weights{v1alpha1.ScorerQueue: 1, v1alpha1.ScorerPrefix: 0}, false},
		{"predicted latency counts cached prefixes", Weights{v1alpha1.ScorerPredictedLatency: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Profile{Weights: tc.w}).UsesPrefix(); got != tc.want {
				t.Errorf("UsesPrefix = %v", got)
			}
		})
	}
}

// timings records a Timer's calls.
type timings struct {
	asked []string // the plugins the picker asked for, "point/plugin"
	calls map[string]int
	bad   []time.Duration
}

func (r *timings) timer(point, plugin string) func(time.Duration) {
	key := point + "/" + plugin
	r.asked = append(r.asked, key)
	return func(d time.Duration) {
		r.calls[key]++
		if d < 0 {
			r.bad = append(r.bad, d)
		}
	}
}

// TestTimer: a timed picker calls its timer once per filter and per scorer
// that ran in a timed decision (the first, then one in oneIn), with a time
// that is not negative, and decides as the untimed picker does.
func TestTimer(t *testing.T) {
	weights := Weights{v1alpha1.ScorerQueue: 1, v1alpha1.ScorerKVCache: 2, v1alpha1.ScorerPrefix: 3, v1alpha1.ScorerErrorRate: 1}
	fleet := func() []Endpoint {
		var eps []Endpoint
		for i := range 12 {
			e := ep(fmt.Sprintf("e%d", i), engine.Metrics{Waiting: float64(i % 3), KVUsage: float64(i%5) / 10})
			e.PrefixMatch = float64(i%4) / 4
			eps = append(eps, e)
		}
		return eps
	}
	unscraped := fleet()
	unscraped[0].Missing = engine.SignalQueue // the queue scorer sits out
	filtersRun := func() map[string]int {
		m := map[string]int{}
		for _, f := range filters {
			m[PointFilter+"/"+string(f.Name)] = 1
		}
		return m
	}
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		ran  []v1alpha1.ScorerName
	}{
		{"every scorer runs", fleet(), []v1alpha1.ScorerName{v1alpha1.ScorerQueue, v1alpha1.ScorerKVCache, v1alpha1.ScorerPrefix, v1alpha1.ScorerErrorRate}},
		{"a scorer sits out", unscraped, []v1alpha1.ScorerName{v1alpha1.ScorerKVCache, v1alpha1.ScorerPrefix, v1alpha1.ScorerErrorRate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &timings{calls: map[string]int{}}
			timed := NewWeighted(Profile{Weights: weights}, Thresholds{}, 7).WithTimer(r.timer, 1)
			untimed := NewWeighted(Profile{Weights: weights}, Thresholds{}, 7)
			if len(r.asked) != len(filters)+len(weights) {
				t.Errorf("asked for %v: every filter and each weighed scorer once", r.asked)
			}
			got := timed.Pick(Request{}, slices.Clone(tc.eps))
			want := untimed.Pick(Request{}, slices.Clone(tc.eps))
			if !slices.Equal(addrs(got), addrs(want)) {
				t.Errorf("timed picker ranked %v, untimed %v", addrs(got), addrs(want))
			}
			wantCalls := filtersRun()
			for _, n := range tc.ran {
				wantCalls[PointScorer+"/"+string(n)] = 1
			}
			if !maps.Equal(r.calls, wantCalls) {
				t.Errorf("calls %v, want %v", r.calls, wantCalls)
			}
			if len(r.bad) > 0 {
				t.Errorf("negative durations %v", r.bad)
			}
		})
	}
	t.Run("nil times nothing", func(t *testing.T) {
		p := NewWeighted(Profile{Weights: weights}, Thresholds{}, 7).WithTimer(nil, 1)
		if d := p.Pick(Request{}, fleet()); len(d.Ranked) == 0 || p.filterTimers != nil || p.scoreTimers != nil {
			t.Errorf("ranked %v, timers %v %v", addrs(d), p.filterTimers, p.scoreTimers)
		}
	})
	for _, tc := range []struct {
		oneIn, picks, timed int
	}{{1, 5, 5}, {4, 1, 1}, {4, 4, 1}, {4, 5, 2}, {4, 9, 3}, {0, 3, 3}} {
		t.Run(fmt.Sprintf("%d picks, one in %d timed", tc.picks, tc.oneIn), func(t *testing.T) {
			r := &timings{calls: map[string]int{}}
			p := NewWeighted(Profile{Weights: weights}, Thresholds{}, 7).WithTimer(r.timer, tc.oneIn)
			for range tc.picks {
				p.Pick(Request{}, fleet())
			}
			for _, f := range filters {
				if got := r.calls[PointFilter+"/"+string(f.Name)]; got != tc.timed {
					t.Errorf("%s timed %d times, want %d", f.Name, got, tc.timed)
				}
			}
			if got := r.calls[PointScorer+"/"+string(v1alpha1.ScorerPrefix)]; got != tc.timed {
				t.Errorf("prefix timed %d times, want %d", got, tc.timed)
			}
		})
	}
	t.Run("no endpoint", func(t *testing.T) {
		r := &timings{calls: map[string]int{}}
		p := NewWeighted(Profile{Weights: weights}, Thresholds{}, 7).WithTimer(r.timer, 1)
		if d := p.Pick(Request{}, nil); len(d.Ranked) != 0 || len(r.calls) != 0 {
			t.Errorf("ranked %v, timed %v", addrs(d), r.calls)
		}
	})
}

// BenchmarkTimer compares a decision over 64 endpoints untimed and timed into
// the gateway's plugin histogram, every time or one in TimeOneIn: the
// difference is what the timing costs.
func BenchmarkTimer(b *testing.B) {
	chat, err := LookupProfile(string(DefaultProfile))
	if err != nil {
		b.Fatal(err)
	}
	var eps []Endpoint
	for i := range 64 {
		e := ep(fmt.Sprintf("e%d", i), engine.Metrics{Waiting: float64(i % 4), KVUsage: float64(i%7) / 10})
		e.PrefixMatch = float64(i%5) / 5
		eps = append(eps, e)
	}
	for _, tc := range []struct {
		name  string
		timer Timer
		oneIn int
	}{{"untimed", nil, 1}, {"every decision timed", telemetry.NewGateway().PluginTimer, 1},
		{"one in TimeOneIn timed", telemetry.NewGateway().PluginTimer, TimeOneIn}} {
		b.Run(tc.name, func(b *testing.B) {
			p := NewWeighted(chat, Thresholds{}, 1).WithTimer(tc.timer, tc.oneIn)
			req := Request{PromptTokens: 8000}
			b.ReportAllocs()
			for b.Loop() {
				p.Pick(req, eps)
			}
		})
	}
}
