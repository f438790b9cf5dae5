package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

func newSimEngine(t *testing.T, cfg sim.Config) *sim.Engine {
	t.Helper()
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var (
	h100  = sim.Config{GPU: "h100", ModelSize: "8b", TensorParallel: 1}
	a10g  = sim.Config{GPU: "a10g", ModelSize: "8b", TensorParallel: 1}
	lora1 = sim.Config{GPU: "h100", ModelSize: "8b", TensorParallel: 1, MaxLoRAs: 1}
)

// request is a sim request of prompt tokens whose blocks hash from seed: two
// requests of one seed share their prompt's blocks.
func request(prompt, out int, seed uint64, adapter string) sim.Request {
	h := make([]uint64, prompt/blockTokens)
	for i := range h {
		h[i] = seed<<32 | uint64(i)
	}
	return sim.Request{PromptTokens: prompt, BlockHashes: h, OutputTokens: out, IgnoreEOS: true, Adapter: adapter}
}

// queue submits n requests to e at its current time.
func queue(t *testing.T, e *sim.Engine, n, prompt, out int, seed uint64) {
	t.Helper()
	for i := range n {
		if _, err := e.Submit(request(prompt, out, seed+uint64(i), "")); err != nil {
			t.Fatal(err)
		}
	}
}

// drain runs e until it is idle.
func drain(e *sim.Engine) {
	for e.Busy() {
		e.Step()
	}
}

// firstToken submits a at its time to e, as Fleet.Run does, and steps until its
// first token: the TTFT the request really gets when nothing else arrives.
func firstToken(t *testing.T, e *sim.Engine, a sim.Arrival) time.Duration {
	t.Helper()
	if !e.Busy() {
		e.AdvanceTo(a.At)
	}
	s, err := e.SubmitAt(a.Req, a.At)
	if err != nil {
		t.Fatal(err)
	}
	for s.FirstToken == 0 {
		e.Step()
	}
	return s.FirstToken - s.Arrival
}

// The oracle's TTFT is the one the engine then gives: on an idle engine, on one
// mid-step (the arrival inside the step in progress), behind a queue, with a
// cached prefix; and the trial leaves the engine as it was.
func TestOracleTrialIsExact(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(e *sim.Engine) time.Duration // returns the arrival time
		req   sim.Request
	}{
		{"idle", func(e *sim.Engine) time.Duration { return time.Second }, request(3000, 8, 1, "")},
		{"mid-step", func(e *sim.Engine) time.Duration {
			queue(t, e, 4, 2000, 64, 100)
			e.Step()
			return e.Now() - time.Millisecond
		}, request(1000, 8, 1, "")},
		{"queued", func(e *sim.Engine) time.Duration {
			queue(t, e, 40, 6000, 32, 100)
			for range 3 {
				e.Step()
			}
			return e.Now()
		}, request(1000, 8, 1, "")},
		{"cached prefix", func(e *sim.Engine) time.Duration {
			if _, err := e.Submit(request(8192, 4, 7, "")); err != nil {
				t.Fatal(err)
			}
			drain(e)
			queue(t, e, 3, 1000, 200, 100)
			e.Step()
			return e.Now() + 5*time.Millisecond
		}, request(8192+512, 8, 7, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSimEngine(t, h100)
			a := sim.Arrival{At: tc.setup(e), Req: tc.req}
			before := e.Snapshot()
			got, ok := ttftIfSubmitted(e, a)
			if !ok {
				t.Fatal("no TTFT")
			}
			after := e.Snapshot()
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("the trial changed the engine:\n%+v\n%+v", before, after)
			}
			if want := firstToken(t, e, a); got != want {
				t.Fatalf("oracle TTFT %v, engine %v", got, want)
			}
		})
	}
}

// Where the best engine is known, the oracle picks it.
func TestOraclePicks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		engines func() []*sim.Engine
		req     sim.Request
		want    int
	}{
		{"queued or idle", func() []*sim.Engine {
			busy := newSimEngine(t, h100)
			queue(t, busy, 30, 4000, 64, 100)
			busy.Step()
			return []*sim.Engine{busy, newSimEngine(t, h100)}
		}, request(500, 8, 1, ""), 1},
		{"slow or fast", func() []*sim.Engine {
			return []*sim.Engine{newSimEngine(t, a10g), newSimEngine(t, h100)}
		}, request(500, 8, 1, ""), 1},
		{"slow idle or fast behind a queue", func() []*sim.Engine {
			busy := newSimEngine(t, h100)
			queue(t, busy, 40, 8000, 64, 100)
			busy.Step()
			return []*sim.Engine{busy, newSimEngine(t, a10g)}
		}, request(300, 8, 1, ""), 1},
		{"prefix cached", func() []*sim.Engine {
			warm := newSimEngine(t, h100)
			if _, err := warm.Submit(request(16384, 4, 7, "")); err != nil {
				t.Fatal(err)
			}
			drain(warm)
			return []*sim.Engine{newSimEngine(t, h100), warm}
		}, request(16384+256, 8, 7, ""), 1},
		{"adapter resident", func() []*sim.Engine {
			var es []*sim.Engine
			for _, ad := range []string{"b", "a"} {
				e := newSimEngine(t, lora1)
				if _, err := e.Submit(request(100, 2, 3, ad)); err != nil {
					t.Fatal(err)
				}
				drain(e)
				es = append(es, e)
			}
			return es
		}, request(200, 8, 1, "a"), 1},
		{"too long for one", func() []*sim.Engine {
			short := newSimEngine(t, sim.Config{GPU: "h100", ModelSize: "8b", MaxModelLen: 4096})
			return []*sim.Engine{short, newSimEngine(t, a10g)}
		}, request(6000, 8, 1, ""), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := tc.engines()
			at := time.Duration(0)
			for _, e := range es {
				at = max(at, e.Now())
			}
			a := sim.Arrival{At: at, Req: tc.req}
			if got := newOracle(es).pick(a); got != tc.want {
				var ttft []string
				for _, e := range es {
					d, ok := ttftIfSubmitted(e, a)
					ttft = append(ttft, fmt.Sprint(d, ok))
				}
				t.Fatalf("picked %d, want %d (TTFTs %v)", got, tc.want, ttft)
			}
		})
	}
}

// On small hand-built traces whose best routing is plain, no policy beats the
// oracle on mean or P95 TTFT by more than 1%.
func TestOracleNoWorse(t *testing.T) {
	mixed := simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{
		servers("h100", "h100", "8b", 1, 1, nil), servers("a10g", "a10g", "8b", 1, 1, nil)}}
	// Work queued on one server first: a 30k-token prompt, whose prefill holds
	// its server's steps for a second and more, then short prompts.
	preload := chatTrace(1, 0, 30000, 32)
	for _, q := range chatTrace(40, 50*time.Millisecond, 300, 32) {
		q.At += 0.01
		preload = append(preload, q)
	}
	// Two groups' 8k-token system prompts, alternating: each belongs on one
	// server.
	var groups workload.Trace
	for i := range 40 {
		g := fmt.Sprint("g", i%2)
		groups = append(groups, workload.Request{At: float64(i) * 0.2, Model: llama8b, Group: g,
			Prompt: []workload.Segment{{ID: g, Tokens: 8192}, {ID: fmt.Sprint("u", i), Tokens: 200}}, OutputTokens: 16})
	}
	for _, tc := range []struct {
		name  string
		fleet simserver.FleetSpec
		trace workload.Trace
	}{
		{"fast and slow", mixed, chatTrace(60, 100*time.Millisecond, 500, 64)},
		{"queue on one", h100s(2), preload},
		{"shared prefixes", h100s(2), groups},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := map[string]report.Result{}
			for _, p := range Policies {
				recs, _, err := RunSim(context.Background(), SimOptions{Fleet: tc.fleet, Policy: p, Seed: 1}, tc.trace)
				if err != nil {
					t.Fatal(err)
				}
				res[p] = report.Summarize(tc.name, p, "sim", recs)
				if res[p].Errors > 0 {
					t.Fatalf("%s: %d errors", p, res[p].Errors)
				}
			}
			o := res[Oracle]
			for _, p := range Policies {
				r := res[p]
				// The oracle is greedy, not optimal: a policy that predicts as
				// well (predicted-latency on a queue it learned) may tie it; 1%
				// better is beyond a tie.
				if float64(mean(r.Records)) < 0.99*float64(mean(o.Records)) || r.TTFTP95ms < 0.99*o.TTFTP95ms {
					t.Errorf("%s beats the oracle: mean TTFT %v vs %v, P95 %.1f vs %.1f ms",
						p, mean(r.Records), mean(o.Records), r.TTFTP95ms, o.TTFTP95ms)
				}
			}
		})
	}
}

func mean(recs []report.Record) time.Duration {
	var sum time.Duration
	for _, r := range recs {
		sum += r.TTFT
	}
	return sum / time.Duration(max(len(recs), 1))
}

// Pruning changes no pick: the oracle that tries every engine to its first
// token picks alike, on a mixed fleet and on a uniform one with LoRA.
func TestOraclePruningExact(t *testing.T) {
	mixed, mtr := quickScenario(t, "mixed-gpu")
	lora, ltr := quickScenario(t, "lora-heavy")
	for _, tc := range []struct {
		fleet simserver.FleetSpec
		trace workload.Trace
	}{{mixed.Fleet, mtr[:150]}, {lora.Fleet, ltr[:80]}} {
		a := simProbe(t, SimOptions{Fleet: tc.fleet, Policy: Oracle, Seed: 1}, tc.trace)
		b := simProbe(t, SimOptions{Fleet: tc.fleet, Policy: Oracle, Seed: 1, exhaustive: true}, tc.trace)
		if !slices.Equal(a, b) {
			t.Fatalf("pruned picks %v\nexhaustive   %v", a, b)
		}
	}
}

// The oracle's picks reproduce for a seed and do not depend on it: it draws
// nothing.
func TestOracleDeterministic(t *testing.T) {
	s, tr := quickScenario(t, "lora-heavy")
	tr = tr[:120]
	a := simProbe(t, SimOptions{Fleet: s.Fleet, Policy: Oracle, Seed: 1}, tr)
	b := simProbe(t, SimOptions{Fleet: s.Fleet, Policy: Oracle, Seed: 2}, tr)
	if !slices.Equal(a, b) {
		t.Fatal("the oracle picked differently under another seed")
	}
}
