package sim

import (
	"math/rand/v2"
	"testing"
	"time"
)

// poisson builds n arrivals at rate per second with ShareGPT-like lengths.
func poisson(n int, rate float64, seed uint64) []Arrival {
	rng := rand.New(rand.NewPCG(seed, seed))
	lens := ShareGPTLike(rng, n)
	out := make([]Arrival, n)
	t := time.Duration(0)
	for i := range out {
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		out[i] = Arrival{At: t, Req: Request{PromptTokens: lens[i][0], OutputTokens: lens[i][1]}}
	}
	return out
}

func newFleet(t testing.TB, cfgs ...Config) *Fleet {
	var es []*Engine
	for _, c := range cfgs {
		e, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	return NewFleet(es)
}

func TestFleetRunsEveryRequest(t *testing.T) {
	f := newFleet(t, h100, h100, Config{GPU: "a10g", ModelSize: "8b"})
	arrivals := poisson(600, 20, 1)
	n := 0
	rr := 0
	perEngine := make([]int, 3)
	var lastDone time.Duration
	end, err := f.Run(arrivals, func(Arrival) int { rr++; return rr % 3 }, func(i int, s *Seq) {
		n++
		perEngine[i]++
		if s.FirstToken < s.Arrival || s.Done < s.FirstToken || s.Generated != s.Req.OutputTokens {
			t.Fatalf("inconsistent sequence %+v", s)
		}
		lastDone = max(lastDone, s.Done)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 600 || perEngine[0] != 200 || perEngine[2] != 200 {
		t.Fatalf("finished %d (%v), want 600 split evenly", n, perEngine)
	}
	if end != lastDone || end < arrivals[len(arrivals)-1].At {
		t.Errorf("run ended at %v, last request done at %v, last arrival %v", end, lastDone, arrivals[len(arrivals)-1].At)
	}
}

// An arrival in the middle of a step waits for it and counts its latency from its
// own arrival, not from the step's end.
func TestArrivalMidStepCountsFromArrival(t *testing.T) {
	f := newFleet(t, h100)
	arrivals := []Arrival{
		{At: 0, Req: Request{PromptTokens: 8000, OutputTokens: 2}},
		{At: time.Millisecond, Req: Request{PromptTokens: 10, OutputTokens: 1}},
	}
	var second *Seq
	if _, err := f.Run(arrivals, func(Arrival) int { return 0 }, func(_ int, s *Seq) {
		if s.Req.PromptTokens == 10 {
			second = s
		}
	}); err != nil {
		t.Fatal(err)
	}
	if second.Arrival != time.Millisecond {
		t.Fatalf("arrival recorded at %v", second.Arrival)
	}
	if ttft := second.FirstToken - second.Arrival; ttft < 200*time.Millisecond {
		t.Errorf("TTFT %v: the request did not wait for the 8000-token prefill step under way", ttft)
	}
}

// BenchmarkVirtualFleet is the simulator's own cost in virtual-time runs:
// 100 H100 servers, 100,000 ShareGPT-like requests at 70% of fleet capacity,
// round-robin. docs/benchmarks.md quotes it.
func BenchmarkVirtualFleet(b *testing.B) {
	const servers, requests = 100, 100_000
	arrivals := poisson(requests, 100*14, 42) // an H100 sustains ~20 req/s of this mix
	for b.Loop() {
		cfgs := make([]Config, servers)
		for i := range cfgs {
			cfgs[i] = Config{GPU: "h100", ModelSize: "8b", Seed: uint64(i)}
		}
		f := newFleet(b, cfgs...)
		rr := 0
		var tokens int
		end, err := f.Run(arrivals, func(Arrival) int { rr++; return rr % servers }, func(_ int, s *Seq) { tokens += s.Generated })
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(end.Seconds(), "virtual-s")
		b.ReportMetric(float64(tokens), "tokens")
	}
}
