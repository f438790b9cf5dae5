package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// busyArrivals is a workload that keeps a small engine under pressure: shared
// prefixes, adapters competing for two slots, drawn and fixed output lengths.
func busyArrivals(seed uint64, n int) []Arrival {
	rng := rand.New(rand.NewPCG(seed, 2))
	out := make([]Arrival, n)
	var at time.Duration
	for i := range out {
		at += time.Duration(rng.ExpFloat64() * float64(15*time.Millisecond))
		p := 20 + rng.IntN(1500)
		req := Request{PromptTokens: p, BlockHashes: hashes(uint64(rng.IntN(4)), p), MaxTokens: 1 + rng.IntN(300),
			Adapter: []string{"", "", "a", "b", "c"}[rng.IntN(5)], Tag: uint64(i)}
		if rng.IntN(2) == 0 {
			req.OutputTokens = 1 + rng.IntN(200)
		}
		out[i] = Arrival{At: at, Req: req}
	}
	return out
}

var smallEngine = Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 300, MaxLoRAs: 2, MaxNumSeqs: 16, MaxNumBatchedTokens: 1024}

// fingerprint renders every part of an engine's state that decides its future:
// clock, counters, generator state, queues with their sequences, KV cache
// arrays, prefix index and LRU order, LoRA slots.
func fingerprint(e *Engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "now %v next %d pcg %+v\nstats %+v\n", e.now, e.nextID, *e.pcg, e.stats)
	seq := func(s *Seq) {
		v := *s
		v.trial = 0
		if len(v.derived) == 0 {
			v.derived = nil
		}
		if len(v.blocks) == 0 {
			v.blocks = nil
		}
		fmt.Fprintf(&b, "%+v\n", v)
	}
	b.WriteString("running\n")
	for _, s := range e.running {
		seq(s)
	}
	b.WriteString("waiting\n")
	e.waiting.each(seq)
	c := e.kv
	fmt.Fprintf(&b, "kv refs %v\nhash %v\nhashed %v\nprev %v\nnext %v\nhead %d tail %d evictable %d\nplain %v\n",
		c.refs, c.hash, c.hashed, c.prev, c.next, c.head, c.tail, c.evictable, c.plain)
	keys := make([]uint64, 0, len(c.cached))
	for h := range c.cached {
		keys = append(keys, h)
	}
	slices.Sort(keys)
	for _, h := range keys {
		fmt.Fprintf(&b, "%x:%d ", h, c.cached[h])
	}
	fmt.Fprintf(&b, "\nlora %v %v\n", e.lora.order, e.lora.users)
	return b.String()
}

// record is what a request got, for comparing runs.
type record struct {
	tag                    uint64
	first, done            time.Duration
	generated, cached, pre int
	finish                 FinishReason
}

func recordOf(s *Seq) record {
	return record{s.Req.Tag, s.FirstToken - s.Arrival, s.Done, s.Generated, s.CachedTokens, s.Preemptions, s.Finish}
}

// runFleet serves arrivals on one engine as Fleet.Run does, calling before (if
// set) as each arrival is routed, and returns what every request got.
func runFleet(t *testing.T, e *Engine, arrivals []Arrival, before func(a Arrival)) []record {
	t.Helper()
	f := NewFleet([]*Engine{e})
	var out []record
	if _, err := f.Run(arrivals, func(a Arrival) int {
		if before != nil {
			before(a)
		}
		return 0
	}, func(_ int, s *Seq) { out = append(out, recordOf(s)) }); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out, func(a, b record) int { return int(a.tag) - int(b.tag) })
	return out
}

// TestTrialsLeaveTheRunUnchanged asks FirstTokenIfSubmitted at every arrival of a
// busy run, and checks the run is the one it is without the questions.
func TestTrialsLeaveTheRunUnchanged(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cfg := smallEngine
			cfg.Seed = seed
			arrivals := busyArrivals(seed, 300)
			for i := range arrivals {
				arrivals[i].At *= 3 // loaded, without a queue that grows all run
			}
			want := runFleet(t, mustEngine(t, cfg), arrivals, nil)
			e := mustEngine(t, cfg)
			asked := 0
			got := runFleet(t, e, arrivals, func(a Arrival) {
				asked++
				check := asked%40 == 0
				var before string
				if check {
					before = fingerprint(e)
				}
				if _, err := e.FirstTokenIfSubmitted(a.Req, a.At); err != nil {
					t.Fatal(err)
				}
				if check {
					if after := fingerprint(e); after != before {
						t.Fatalf("arrival %d: the engine changed across a trial:\n%s", a.Req.Tag, firstDiff(before, after))
					}
					checkInvariants(t, e)
				}
			})
			if !slices.Equal(got, want) {
				t.Fatal("a run with trials differs from one without")
			}
			if st := e.Snapshot().Stats; st.Preemptions == 0 || st.PrefixHits == 0 || st.LoRALoads == 0 {
				t.Errorf("run did not exercise preemption, the prefix cache and LoRA: %+v", st)
			}
		})
	}
}

func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d:\n- %.300s\n+ %.300s", i, la[i], lb[i])
		}
	}
	return "lengths differ"
}

// TestFirstTokenIfSubmittedIsTheTTFT: at points of a busy run, the answer equals
// the TTFT a clone gets when the request is submitted to it, and the TTFT the
// engine itself gets when it is, with no later arrival.
func TestFirstTokenIfSubmittedIsTheTTFT(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"small", smallEngine},
		{"h100 defaults", Config{GPU: "h100", ModelSize: "8b", MaxLoRAs: 2}},
		{"a10g defaults", Config{GPU: "a10g", ModelSize: "8b", MaxLoRAs: 2}},
	} {
		for _, stop := range []int{0, 7, 60, 150, 299} {
			t.Run(fmt.Sprint(tc.name, "/", stop), func(t *testing.T) {
				cfg := tc.cfg
				cfg.Seed = uint64(stop)
				arrivals := busyArrivals(uint64(stop)+10, 300)
				for i := range arrivals {
					arrivals[i].At /= 4 // heavier still
				}
				e := mustEngine(t, cfg)
				// Serve arrivals before stop; at stop, ask, then submit for real.
				var predicted, viaClone time.Duration
				var real *Seq
				f := NewFleet([]*Engine{e})
				_, err := f.Run(arrivals[:stop+1], func(a Arrival) int {
					if int(a.Req.Tag) != stop {
						return 0
					}
					var err error
					if predicted, err = e.FirstTokenIfSubmitted(a.Req, a.At); err != nil {
						t.Fatal(err)
					}
					c := e.Clone()
					if !c.Busy() {
						c.AdvanceTo(a.At)
					}
					s, err := c.SubmitAt(a.Req, a.At)
					if err != nil {
						t.Fatal(err)
					}
					for s.Generated == 0 {
						c.Step()
					}
					viaClone = s.FirstToken - s.Arrival
					return 0
				}, func(_ int, s *Seq) {
					if int(s.Req.Tag) == stop {
						real = s
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				if real == nil || real.Generated == 0 {
					t.Fatal("the request never ran")
				}
				if got := real.FirstToken - real.Arrival; predicted != got || viaClone != got {
					t.Errorf("FirstTokenIfSubmitted %v, via a clone %v, real TTFT %v", predicted, viaClone, got)
				}
			})
		}
	}
}

// TestCloneInLockstep: a clone taken mid-run and driven exactly as the original
// does exactly what it does, step by step; the original, meanwhile, is not
// changed by anything done to the clone.
func TestCloneInLockstep(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cfg := smallEngine
			cfg.Seed = seed
			arrivals := busyArrivals(seed, 300)
			e := mustEngine(t, cfg)
			// Run the first half.
			f := NewFleet([]*Engine{e})
			if _, err := f.Run(arrivals[:150], func(Arrival) int { return 0 }, nil); err != nil {
				t.Fatal(err)
			}
			// Leave work in flight: submit a few and step once.
			for _, a := range arrivals[150:160] {
				if _, err := e.SubmitAt(a.Req, e.Now()); err != nil {
					t.Fatal(err)
				}
			}
			e.Step()
			before, snap := fingerprint(e), e.Snapshot()

			// Whatever happens to a clone leaves the original alone.
			scratch := e.Clone()
			if fingerprint(scratch) != before {
				t.Fatalf("clone differs from its original:\n%s", firstDiff(before, fingerprint(scratch)))
			}
			for _, a := range arrivals[160:] {
				if _, err := scratch.SubmitAt(a.Req, scratch.Now()); err != nil {
					t.Fatal(err)
				}
			}
			for scratch.Busy() {
				scratch.Step()
			}
			if after := fingerprint(e); after != before {
				t.Fatalf("advancing a clone changed the original:\n%s", firstDiff(before, after))
			}
			if !snapshotsEqual(snap, e.Snapshot()) {
				t.Fatal("advancing a clone changed the original's snapshot")
			}

			// A clone driven like the original stays its twin.
			c := e.Clone()
			rest := arrivals[160:]
			for step := 0; e.Busy() || len(rest) > 0; step++ {
				if len(rest) > 0 && (!e.Busy() || e.Now() >= rest[0].At) {
					for _, x := range []*Engine{e, c} {
						if !x.Busy() {
							x.AdvanceTo(rest[0].At)
						}
						if _, err := x.SubmitAt(rest[0].Req, rest[0].At); err != nil {
							t.Fatal(err)
						}
					}
					rest = rest[1:]
					continue
				}
				re, rc := e.Step(), c.Step()
				if re.Start != rc.Start || re.End != rc.End || re.Work != rc.Work || !sameSeqs(re.Emitted, rc.Emitted) || !sameSeqs(re.Finished, rc.Finished) {
					t.Fatalf("step %d: original %+v, clone %+v", step, re, rc)
				}
				if !snapshotsEqual(e.Snapshot(), c.Snapshot()) {
					t.Fatalf("step %d: snapshots differ", step)
				}
			}
			if a, b := fingerprint(e), fingerprint(c); a != b {
				t.Fatalf("after the run:\n%s", firstDiff(a, b))
			}
		})
	}
}

func sameSeqs(a, b []*Seq) bool {
	return slices.EqualFunc(a, b, func(x, y *Seq) bool { return x != y && recordOf(x) == recordOf(y) && x.ID == y.ID })
}

func snapshotsEqual(a, b Snapshot) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// The cost of the oracle's question on a loaded engine, against answering it
// with a clone.
func benchmarkTTFTQuestion(b *testing.B, viaClone bool) {
	e, err := New(Config{GPU: "h100", ModelSize: "8b"})
	if err != nil {
		b.Fatal(err)
	}
	arrivals := busyArrivals(1, 3000)
	for i := range arrivals {
		arrivals[i].Req.Adapter = ""
	}
	// Load the engine: 600 requests over 2 s of arrivals, then stop mid-run.
	f := NewFleet([]*Engine{e})
	if _, err := f.Run(arrivals[:600], func(Arrival) int { return 0 }, nil); err != nil {
		b.Fatal(err)
	}
	for _, a := range arrivals[600:900] {
		if _, err := e.SubmitAt(a.Req, e.Now()); err != nil {
			b.Fatal(err)
		}
	}
	for range 50 {
		e.Step()
	}
	q := arrivals[900].Req
	snap := e.Snapshot()
	b.ResetTimer()
	for b.Loop() {
		if viaClone {
			c := e.Clone()
			s, _ := c.SubmitAt(q, c.Now())
			for s.Generated == 0 {
				c.Step()
			}
		} else if _, err := e.FirstTokenIfSubmitted(q, e.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(snap.Running), "running")
	b.ReportMetric(float64(snap.Waiting), "waiting")
}

func BenchmarkFirstTokenIfSubmitted(b *testing.B) { benchmarkTTFTQuestion(b, false) }
func BenchmarkFirstTokenViaClone(b *testing.B)    { benchmarkTTFTQuestion(b, true) }

// A request the engine refuses is refused by the question too, and leaves the
// engine as it was.
func TestFirstTokenIfSubmittedRefuses(t *testing.T) {
	e := mustEngine(t, smallEngine)
	mustSubmit(t, e, Request{PromptTokens: 500, MaxTokens: 100, IgnoreEOS: true})
	e.Step()
	before := fingerprint(e)
	if _, err := e.FirstTokenIfSubmitted(Request{PromptTokens: e.MaxModelLen()}, e.Now()); !errors.Is(err, ErrContextLength) {
		t.Fatalf("over-long prompt: %v, want ErrContextLength", err)
	}
	if after := fingerprint(e); after != before {
		t.Fatalf("a refused question changed the engine:\n%s", firstDiff(before, after))
	}
	// An idle engine answers with the request's own prefill.
	idle := mustEngine(t, h100)
	idle.AdvanceTo(time.Second)
	got, err := idle.FirstTokenIfSubmitted(Request{PromptTokens: 1024, MaxTokens: 1}, 2*time.Second)
	if want, _ := MeasureTTFT(h100, 1024); err != nil || got != want {
		t.Errorf("idle engine: %v, %v; want %v", got, err, want)
	}
	if idle.Now() != time.Second {
		t.Errorf("the question moved an idle engine's clock to %v", idle.Now())
	}
}
