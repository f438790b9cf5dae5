package schedule

import (
	"math"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/latency"
)

func ep(addr string, m engine.Metrics) Endpoint {
	return Endpoint{Address: addr, Signals: Signals{Metrics: m, HasMetrics: true, Healthy: true}}
}

func TestScorers(t *testing.T) {
	lora := func(max int, running, waiting []string) engine.Metrics {
		return engine.Metrics{HasLoRA: true, MaxLoRA: max, RunningAdapters: running, WaitingAdapters: waiting}
	}
	for _, tc := range []struct {
		name   string
		scorer Scorer
		req    Request
		eps    []Endpoint
		want   []float64
	}{
		{"kv cache", KVCache{}, Request{}, []Endpoint{ep("a", engine.Metrics{KVUsage: 0}), ep("b", engine.Metrics{KVUsage: 0.75}), ep("c", engine.Metrics{KVUsage: 1.2})}, []float64{1, 0.25, 0}},
		{"queue min-max", Queue{}, Request{}, []Endpoint{ep("a", engine.Metrics{Waiting: 0}), ep("b", engine.Metrics{Waiting: 5}), ep("c", engine.Metrics{Waiting: 10})}, []float64{1, 0.5, 0}},
		{"queue all equal", Queue{}, Request{}, []Endpoint{ep("a", engine.Metrics{Waiting: 3}), ep("b", engine.Metrics{Waiting: 3})}, []float64{1, 1}},
		{"running min-max", RunningRequests{}, Request{}, []Endpoint{ep("a", engine.Metrics{Running: 8}), ep("b", engine.Metrics{Running: 2})}, []float64{0, 1}},
		{"queue spread: one request is a quarter", Queue{Spread: 4}, Request{}, []Endpoint{ep("a", engine.Metrics{Waiting: 1}), ep("b", engine.Metrics{Waiting: 0})}, []float64{0.75, 1}},
		{"queue spread exceeded: min-max", Queue{Spread: 4}, Request{}, []Endpoint{ep("a", engine.Metrics{Waiting: 10}), ep("b", engine.Metrics{Waiting: 2}), ep("c", engine.Metrics{Waiting: 6})}, []float64{0, 1, 0.5}},
		{"prefill queue by tokens, not requests", PrefillQueue{}, Request{}, []Endpoint{{Address: "a", Signals: Signals{PrefillTokens: 8000}}, {Address: "b", Signals: Signals{PrefillTokens: 300}}, {Address: "c"}}, []float64{0, 1 - 300.0/8000, 1}},
		{"error rate", ErrorRate{Spread: 0.1}, Request{}, []Endpoint{{Address: "a", Signals: Signals{ErrorRate: 0.05}}, {Address: "b"}, {Address: "c", Signals: Signals{ErrorRate: 1.5}}}, []float64{0.95, 1, 0}},
		{"error rate within the spread", ErrorRate{Spread: 0.1}, Request{}, []Endpoint{{Address: "a", Signals: Signals{ErrorRate: 0.05}}, {Address: "b"}}, []float64{0.5, 1}},
		{"failures every endpoint shares blame none", ErrorRate{Spread: 0.1}, Request{}, []Endpoint{{Address: "a", Signals: Signals{ErrorRate: 0.3}}, {Address: "b", Signals: Signals{ErrorRate: 0.3}}}, []float64{1, 1}},
		{"prefill queue spread", PrefillQueue{Spread: 4096}, Request{}, []Endpoint{{Address: "a", Signals: Signals{PrefillTokens: 1024}}, {Address: "b"}}, []float64{0.75, 1}},
		{"running spread", RunningRequests{Spread: 8}, Request{}, []Endpoint{ep("a", engine.Metrics{Running: 12}), ep("b", engine.Metrics{Running: 10})}, []float64{0.75, 1}},
		{"lora resident, free slot, waiting, none", LoRAAffinity{}, Request{Adapter: "x"}, []Endpoint{
			ep("a", lora(2, []string{"x"}, nil)),
			ep("b", lora(2, []string{"y"}, nil)),
			ep("c", lora(2, []string{"y"}, []string{"x"})),
			ep("d", lora(1, []string{"y"}, nil)),
		}, []float64{1, 0.8, 0.6, 0}},
		// Loaded but idle: only this gateway's recent requests say where it is,
		// and a slot its recent adapters fill is no free slot.
		{"lora loaded but idle, slots held", LoRAAffinity{}, Request{Adapter: "x"}, []Endpoint{
			loaded(ep("a", lora(2, nil, nil)), true, 2),
			loaded(ep("b", lora(2, nil, nil)), false, 2),
			loaded(ep("c", lora(2, nil, nil)), false, 1),
		}, []float64{1, 0, 0.8}},
		{"lora base model", LoRAAffinity{}, Request{}, []Endpoint{ep("a", lora(1, []string{"y"}, nil))}, []float64{1}},
		{"prefix", Prefix{}, Request{}, []Endpoint{{Address: "a", Signals: Signals{PrefixMatch: 0.5}}, {Address: "b", Signals: Signals{PrefixMatch: 2}}}, []float64{0.5, 1}},
		{"empty", Queue{}, Request{}, nil, []float64{}},
		{"predicted latency: best over each", PredictedLatency{}, Request{PromptTokens: 1000}, []Endpoint{
			{Address: "fast", Signals: Signals{Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1}}},
			{Address: "slow", Signals: Signals{Speed: latency.Speed{PerKToken: 0.4, PerKTokenQueued: 0.4}}},
			{Address: "fast, 3000 tokens ahead", Signals: Signals{PrefillWork: 3000, Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1}}},
		}, []float64{1, 0.3, 0.3}},
		{"predicted latency: within the tolerance of the best costs little", PredictedLatency{}, Request{PromptTokens: 1000}, []Endpoint{
			{Address: "a", Signals: Signals{Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1}}},
			{Address: "b, 20% slower", Signals: Signals{Speed: latency.Speed{PerKToken: 0.12, PerKTokenQueued: 0.12}}},
		}, []float64{1, 1 - 0.04*0.2/0.25}},
		{"predicted latency: a cached prefix is no work", PredictedLatency{}, Request{PromptTokens: 1000}, []Endpoint{
			{Address: "cold", Signals: Signals{Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1}}},
			{Address: "half cached", Signals: Signals{PrefixMatch: 0.5, Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1}}},
		}, []float64{0.6, 1}},
		{"predicted latency: waiting requests at the typical prompt", PredictedLatency{}, Request{PromptTokens: 500}, []Endpoint{
			{Address: "others' queue", Signals: Signals{Metrics: engine.Metrics{Waiting: 3}, Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1, MeanPrefillTokens: 500}}},
			{Address: "own queue", Signals: Signals{PrefillWork: 500, Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1, MeanPrefillTokens: 500}}},
			{Address: "queue not published", Signals: Signals{Metrics: engine.Metrics{Waiting: 3, Missing: engine.SignalQueue}, Speed: latency.Speed{PerKToken: 0.1, PerKTokenQueued: 0.1, MeanPrefillTokens: 500}}},
		}, []float64{0.3, 0.6, 1}},
		{"session: its endpoint within its share", SessionAffinity{}, Request{}, []Endpoint{
			{Address: "a", InFlight: 2, Signals: Signals{Session: true}}, {Address: "b", InFlight: 2}, {Address: "c", InFlight: 1},
		}, []float64{1, 0, 0}},
		{"session: its endpoint past its share", SessionAffinity{}, Request{}, []Endpoint{
			{Address: "a", InFlight: 6, Signals: Signals{Session: true}}, {Address: "b", InFlight: 1}, {Address: "c", InFlight: 1},
		}, []float64{0, 0, 0}},
		{"session: none", SessionAffinity{}, Request{}, []Endpoint{{Address: "a"}, {Address: "b"}}, []float64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]float64, len(tc.eps))
			for i := range got {
				got[i] = -1 // a scorer must write every entry
			}
			tc.scorer.Score(tc.req, tc.eps, got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("%s scores %v, want %v", tc.scorer.Name(), got, tc.want)
			}
		})
	}
}

func TestWeightedPicker(t *testing.T) {
	p := NewWeighted(Profile{Weights: GIEDefault}, Thresholds{}, 1)
	for _, tc := range []struct {
		name  string
		req   Request
		eps   []Endpoint
		first string
		n     int
	}{
		{"emptier KV and queue wins", Request{}, []Endpoint{
			ep("busy", engine.Metrics{Waiting: 4, KVUsage: 0.7}), ep("idle", engine.Metrics{Waiting: 0, KVUsage: 0.1}),
		}, "idle", 2},
		{"prefix outweighs a little load", Request{}, []Endpoint{
			{Address: "cold", Signals: Signals{Healthy: true, Metrics: engine.Metrics{Waiting: 0, KVUsage: 0.1}}},
			{Address: "warm", Signals: Signals{Healthy: true, PrefixMatch: 1, Metrics: engine.Metrics{Waiting: 1, KVUsage: 0.3}}},
		}, "warm", 2},
		{"unhealthy dropped", Request{}, []Endpoint{
			{Address: "down", Signals: Signals{Healthy: false}}, ep("up", engine.Metrics{Waiting: 3, KVUsage: 0.5}),
		}, "up", 1},
		{"stale dropped while a fresh one exists", Request{}, []Endpoint{
			{Address: "stale", Signals: Signals{Healthy: true, Stale: true}}, ep("fresh", engine.Metrics{Waiting: 4}),
		}, "fresh", 1},
		{"saturated dropped", Request{}, []Endpoint{
			ep("full", engine.Metrics{KVUsage: 0.95}), ep("ok", engine.Metrics{Waiting: 4, KVUsage: 0.5}),
		}, "ok", 1},
		{"saturated but holding the prompt: kept beside the unsaturated", Request{}, []Endpoint{
			{Address: "warm", Signals: Signals{Healthy: true, PrefixMatch: 1, Metrics: engine.Metrics{Waiting: 6, KVUsage: 0.3}}},
			{Address: "cold", Signals: Signals{Healthy: true, PrefixMatch: 0.2, Metrics: engine.Metrics{Waiting: 1, KVUsage: 0.3}}},
			{Address: "cold-full", Signals: Signals{Healthy: true, Metrics: engine.Metrics{Waiting: 6, KVUsage: 0.3}}},
		}, "", 2},
		{"saturated and holding little more: dropped", Request{}, []Endpoint{
			{Address: "warmish", Signals: Signals{Healthy: true, PrefixMatch: 0.4, Metrics: engine.Metrics{Waiting: 6, KVUsage: 0.3}}},
			{Address: "cold", Signals: Signals{Healthy: true, PrefixMatch: 0.2, Metrics: engine.Metrics{Waiting: 1, KVUsage: 0.3}}},
		}, "cold", 1},
		{"all saturated: fail open", Request{}, []Endpoint{
			ep("x", engine.Metrics{Waiting: 9}), ep("y", engine.Metrics{Waiting: 7}),
		}, "y", 2},
		{"all stale: fail open", Request{}, []Endpoint{
			{Address: "s1", Signals: Signals{Healthy: true, Stale: true}}, {Address: "s2", Signals: Signals{Healthy: true, Stale: true}},
		}, "", 2},
		{"adapter capacity", Request{Adapter: "x"}, []Endpoint{
			ep("full", engine.Metrics{HasLoRA: true, MaxLoRA: 1, RunningAdapters: []string{"y"}}),
			ep("room", engine.Metrics{HasLoRA: true, MaxLoRA: 2, RunningAdapters: []string{"y"}, Waiting: 3}),
		}, "room", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Pick(tc.req, tc.eps)
			if len(d.Ranked) != tc.n || (tc.first != "" && d.Ranked[0].Address != tc.first) {
				t.Fatalf("ranked %+v, want %d led by %q", d.Ranked, tc.n, tc.first)
			}
			for i := 1; i < len(d.Ranked); i++ {
				if d.Ranked[i].Score > d.Ranked[i-1].Score {
					t.Fatal("not sorted by score")
				}
			}
		})
	}
	// With the errorRate scorer, a failing endpoint is no refuge from
	// saturation: the only unsaturated one, failing 30%, still ranks below
	// busy endpoints that do not fail; without the scorer it is kept alone.
	failing := func() []Endpoint {
		e := ep("failing", engine.Metrics{})
		e.ErrorRate = 0.3
		return []Endpoint{ep("busy1", engine.Metrics{Waiting: 6, KVUsage: 0.3}), ep("busy2", engine.Metrics{Waiting: 7, KVUsage: 0.3}), e}
	}
	scored := NewWeighted(Profile{Weights: Weights{"queue": 1, "kvCache": 6, "errorRate": 6}, QueueSpread: 16}, Thresholds{}, 1)
	if d := scored.Pick(Request{}, failing()); len(d.Ranked) != 3 || d.Ranked[0].Address == "failing" {
		t.Errorf("errorRate scored: ranked %+v, want the failing endpoint not first", d.Ranked)
	}
	if d := p.Pick(Request{}, failing()); len(d.Ranked) != 1 || d.Ranked[0].Address != "failing" {
		t.Errorf("no errorRate scorer: ranked %+v, want the unsaturated endpoint alone", d.Ranked)
	}
	// With predictedLatency, a fast server over the queue depth stays a
	// candidate while it is predicted to answer before every one under it
	// (and leads); a slow one over the depth does not; without the scorer
	// the depth alone decides.
	queued := func(fastWaiting float64) []Endpoint {
		fast := ep("fast", engine.Metrics{Waiting: fastWaiting})
		fast.PrefillWork, fast.Speed = 2000*fastWaiting, latency.Speed{Base: 0.01, PerKToken: 0.1, PerKTokenQueued: 0.02, MeanPrefillTokens: 2000, Samples: 50}
		slow := ep("slow", engine.Metrics{Waiting: 4})
		slow.PrefillWork, slow.Speed = 8000, latency.Speed{Base: 0.01, PerKToken: 0.5, PerKTokenQueued: 0.2, MeanPrefillTokens: 2000, Samples: 50}
		return []Endpoint{slow, fast}
	}
	predicting := NewWeighted(Profile{Weights: Weights{"queue": 1, "kvCache": 6, "predictedLatency": 3}}, Thresholds{}, 1)
	for _, tc := range []struct {
		name    string
		p       *Weighted
		waiting float64
		ranked  []string
	}{
		{"predicted sooner: kept over the depth", predicting, 5, []string{"fast", "slow"}},
		{"predicted later: dropped", predicting, 100, []string{"slow"}},
		{"no prediction: the depth decides", NewWeighted(Profile{Weights: Weights{"queue": 1, "kvCache": 6}}, Thresholds{}, 1), 5, []string{"slow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.Pick(Request{PromptTokens: 2000}, queued(tc.waiting))
			var got []string
			for _, c := range d.Ranked {
				got = append(got, c.Address)
			}
			if !slices.Equal(got, tc.ranked) {
				t.Fatalf("ranked %v, want %v", got, tc.ranked)
			}
		})
	}
	// Explanations carry each scorer's score.
	d := p.Pick(Request{}, []Endpoint{ep("a", engine.Metrics{KVUsage: 0.5})})
	s := d.Ranked[0].Scores
	kv, _ := s.Get("kvCache")
	q, _ := s.Get("queue")
	n := 0
	for range s.All() {
		n++
	}
	if kv != 0.5 || q != 1 || n != 3 || d.Ranked[0].Score != 2*0.5+2*1 {
		t.Fatalf("scores %+v total %v", s, d.Ranked[0].Score)
	}
}

// TestMissingSignalsSitOut: a scorer or a threshold reading a signal that a
// candidate does not publish is left out of the whole decision, its weight
// going to the scorers that see every candidate; never read as 0.
func TestMissingSignalsSitOut(t *testing.T) {
	noKV := engine.SignalKVUsage | engine.SignalBlocks
	for _, tc := range []struct {
		name  string
		eps   []Endpoint
		want  string // the pick
		ran   []string
		total float64 // the pick's score
	}{
		{"every candidate publishes KV: the emptier cache wins", []Endpoint{
			ep("full", engine.Metrics{KVUsage: 0.7, Waiting: 1}), ep("empty", engine.Metrics{KVUsage: 0.1, Waiting: 1}),
		}, "empty", []string{"queue", "kvCache"}, 1 + 0.9},
		{"one without KV: kvCache sits out, the queue decides", []Endpoint{
			ep("no-kv", engine.Metrics{Waiting: 3, Missing: noKV}), ep("kv", engine.Metrics{KVUsage: 0.7, Waiting: 0}),
		}, "kv", []string{"queue"}, 2},
		{"one without KV: no KV threshold for any", []Endpoint{
			ep("no-kv", engine.Metrics{Waiting: 1, Missing: noKV}), ep("kv-full", engine.Metrics{KVUsage: 0.95, Waiting: 0}),
		}, "kv-full", []string{"queue"}, 2},
		{"one without a queue: the queue sits out and the queue threshold too", []Endpoint{
			ep("no-queue", engine.Metrics{KVUsage: 0.5, Missing: engine.SignalQueue}), ep("long-queue", engine.Metrics{KVUsage: 0.2, Waiting: 50}),
		}, "long-queue", []string{"kvCache"}, 2 * 0.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewWeighted(Profile{Weights: Weights{"queue": 1, "kvCache": 1}}, Thresholds{}, 1)
			d := p.Pick(Request{}, slices.Clone(tc.eps))
			if d.Ranked[0].Address != tc.want {
				t.Fatalf("picked %s, want %s (%+v)", d.Ranked[0].Address, tc.want, d.Ranked)
			}
			var ran []string
			for name := range d.Ranked[0].Scores.All() {
				ran = append(ran, name)
			}
			if !slices.Equal(ran, tc.ran) {
				t.Fatalf("scorers %v ran, want %v", ran, tc.ran)
			}
			// The weights that ran add up to the profile's: a decision's total
			// keeps its scale.
			if s := d.Ranked[0].Score; math.Abs(s-tc.total) > 1e-9 {
				t.Fatalf("total %v, want %v", s, tc.total)
			}
		})
	}
}

// loaded marks e's adapter affinity as the gateway's recent requests give it.
func loaded(e Endpoint, held bool, n int) Endpoint {
	e.AdapterLoaded, e.AdaptersHeld = held, n
	return e
}
