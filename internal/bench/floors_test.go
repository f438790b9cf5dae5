package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// spaced is a trace of n requests gap apart, request i's prompt of prompt(i)
// segments; outputs are short, so that each request finishes before the next.
func spaced(n int, gap time.Duration, prompt func(i int) []workload.Segment, adapter func(i int) string) workload.Trace {
	tr := make(workload.Trace, n)
	for i := range tr {
		tr[i] = workload.Request{At: 1 + float64(i)*gap.Seconds(), Model: llama8b, Prompt: prompt(i), OutputTokens: 4}
		if adapter != nil {
			tr[i].Adapter = adapter(i)
		}
	}
	return tr
}

// A trace whose requests never overlap gets, under every policy, each request
// alone on an idle engine: its floor. Where the policy's choice of engine or
// its cache state costs something (a slower GPU, an evicted adapter), the
// floor is below, never above.
func TestFloorIsIdleTTFT(t *testing.T) {
	h100 := func(n int, extra func(*simserver.ServerSpec)) simserver.FleetSpec {
		return simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, n, extra)}}
	}
	lengths := []int{16, 100, 512, 3000, 8192, 8193, 20000}
	unique := func(i int) []workload.Segment {
		return []workload.Segment{{ID: fmt.Sprint("u", i), Tokens: lengths[i%len(lengths)]}}
	}
	// Four system prompts of 2,048 tokens, then 100 to 3,000 of the user's.
	shared := func(i int) []workload.Segment {
		return []workload.Segment{{ID: fmt.Sprint("sys", i%4), Tokens: 2048}, {ID: fmt.Sprint("u", i), Tokens: lengths[1+i%4]}}
	}
	for _, tc := range []struct {
		name  string
		fleet simserver.FleetSpec
		trace workload.Trace
		// exact says which requests get exactly their floor under a policy that
		// sent them to server srv; the others get at least it.
		exact func(i, srv int) bool
		// cached says whether the warm floor is below the cold one somewhere.
		cached bool
	}{
		{"unique prompts on 4 H100s", h100(4, nil), spaced(28, 5*time.Second, unique, nil),
			func(int, int) bool { return true }, false},
		{"shared system prompts on one H100, whose cache holds them all", h100(1, nil), spaced(24, 2*time.Second, shared, nil),
			func(int, int) bool { return true }, true},
		{"an H100 and an A10G: the floor is the H100's", simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{
			servers("h100", "h100", "8b", 1, 1, nil), servers("a10g", "a10g", "8b", 1, 1, nil)}},
			spaced(28, 10*time.Second, unique, nil), func(_, srv int) bool { return srv == 0 }, false},
		{"three adapters, one LoRA slot a server: a policy's evictions cost what the floor does not", h100(2, func(s *simserver.ServerSpec) {
			s.MaxLoRAs = 1
			s.LoRALoadTime = simserver.Duration(25 * time.Millisecond)
		}), spaced(20, 2*time.Second, unique, func(i int) string { return fmt.Sprint("adapter-", i%3) }),
			func(i, _ int) bool { return i < 3 }, false}, // each adapter's first request loads it anyway
	} {
		t.Run(tc.name, func(t *testing.T) {
			warm, cold, _, err := idleTTFTs(context.Background(), tc.fleet, tc.trace)
			if err != nil {
				t.Fatal(err)
			}
			below := false
			for i := range warm {
				if warm[i] <= 0 || cold[i] < warm[i] {
					t.Fatalf("request %d: warm floor %v, cold %v", i, warm[i], cold[i])
				}
				below = below || cold[i] > warm[i]
			}
			if below != tc.cached {
				t.Fatalf("warm floor below the cold one: %v, want %v", below, tc.cached)
			}
			floor, err := Floor(context.Background(), tc.fleet, tc.trace)
			if err != nil {
				t.Fatal(err)
			}
			for _, policy := range []string{"round-robin", "least-request", "random", "power-of-two", "gie-default", "kvgate"} {
				var srv []int
				recs, _, err := RunSim(context.Background(), SimOptions{Fleet: tc.fleet, Policy: policy, Seed: 2,
					probe: func(s []int) { srv = append([]int(nil), s...) }}, tc.trace)
				if err != nil {
					t.Fatal(err)
				}
				allExact, above := true, 0
				for i, rec := range recs {
					if i+1 < len(recs) && rec.Arrival+rec.E2E >= recs[i+1].Arrival {
						t.Fatalf("%s: request %d overlaps the next: the trace is not what the test needs", policy, i)
					}
					d := rec.TTFT - warm[i]
					switch {
					case rec.Error:
						t.Fatalf("%s: request %d failed", policy, i)
					case tc.exact(i, srv[i]) && d.Abs() > time.Microsecond:
						t.Errorf("%s: request %d on server %d: TTFT %v, floor %v", policy, i, srv[i], rec.TTFT, warm[i])
					case d < -time.Microsecond:
						t.Errorf("%s: request %d on server %d: TTFT %v below its floor %v", policy, i, srv[i], rec.TTFT, warm[i])
					}
					allExact = allExact && tc.exact(i, srv[i])
					if d > time.Microsecond {
						above++
					}
				}
				// Round-robin sends half the requests to the other server: the slow
				// GPU, or the one that last loaded the other adapter.
				if policy == "round-robin" && !allExact && above == 0 {
					t.Errorf("round-robin: no request above its floor")
				}
				r := report.Summarize("s", policy, "sim", recs)
				for _, p := range []struct {
					name        string
					got, floor  float64
					mustBeEqual bool
				}{{"p50", r.TTFTP50ms, floor.P50ms, allExact}, {"p95", r.TTFTP95ms, floor.P95ms, allExact}, {"p99", r.TTFTP99ms, floor.P99ms, allExact}} {
					if p.got < p.floor-1e-3 || p.mustBeEqual && math.Abs(p.got-p.floor) > 1e-3 {
						t.Errorf("%s: TTFT %s %.4f ms, floor %.4f ms", policy, p.name, p.got, p.floor)
					}
				}
			}
		})
	}
}

// A request that no engine of the fleet can hold fails under every policy and
// has no floor; the others keep theirs.
func TestFloorSkipsWhatNoEngineHolds(t *testing.T) {
	fleet := simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{servers("a10g", "a10g", "8b", 1, 2, nil)}}
	tr := spaced(3, time.Second, func(i int) []workload.Segment {
		return []workload.Segment{{ID: fmt.Sprint("u", i), Tokens: []int{500, 1_000_000, 500}[i]}}
	}, nil)
	warm, cold, _, err := idleTTFTs(context.Background(), fleet, tr)
	if err != nil {
		t.Fatal(err)
	}
	if warm[1] != -1 || cold[1] != -1 || warm[0] <= 0 || warm[2] != warm[0] {
		t.Fatalf("floors %v / %v", warm, cold)
	}
	f, err := Floor(context.Background(), fleet, tr)
	if err != nil || f.Requests != 2 || f.P99ms != f.P50ms {
		t.Fatalf("floor %+v, %v", f, err)
	}
}

// A fleet's capacity adds up its engines', and the load a trace offers is its
// tokens over the span of its arrivals, against that capacity.
func TestDescribeLoad(t *testing.T) {
	one := simserver.FleetSpec{Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 1, nil)}}
	four := simserver.FleetSpec{Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 4, nil)}}
	p1, d1, err := capacity(one, 512, 256)
	if err != nil {
		t.Fatal(err)
	}
	p4, d4, _ := capacity(four, 512, 256)
	if p1 <= 0 || d1 <= 0 || math.Abs(p4/p1-4) > 1e-9 || math.Abs(d4/d1-4) > 1e-9 {
		t.Fatalf("one H100 %.0f/%.0f tokens/s, four %.0f/%.0f", p1, d1, p4, d4)
	}
	if pl, dl, _ := capacity(one, 8192, 256); pl >= p1 || dl >= d1 {
		t.Fatalf("longer prompts cost no more: prefill %.0f vs %.0f, decode %.0f vs %.0f", pl, p1, dl, d1)
	}
	// 11 requests a second apart, 1,000 prompt and 100 output tokens each: 1,100
	// and 110 tokens/s over the 10 s their arrivals span.
	tr := spaced(11, time.Second, func(i int) []workload.Segment { return []workload.Segment{{ID: fmt.Sprint("u", i), Tokens: 1000}} }, nil)
	for i := range tr {
		tr[i].OutputTokens = 100
	}
	for _, tc := range []struct {
		name   string
		spec   workload.Spec
		cached float64
		want   []string
		not    []string
	}{
		{"steady", workload.Spec{Kind: "poisson"}, 0, []string{"1.1k prompt tokens/s against a prefill capacity of ~", "110 output tokens/s against a decode capacity of ~"},
			[]string{"bursts", "cached"}},
		{"cached prefixes", workload.Spec{Kind: "shared-prefix"}, 0.9, []string{"110/s", "once the 90% of prompt tokens an earlier request computed are cached"}, nil},
		{"bursts", workload.Spec{Kind: "bursty", Rate: 32, BurstFactor: 10, BurstOn: 5 * time.Second, BurstOff: 25 * time.Second}, 0,
			[]string{"in bursts ~", "(128 requests/s for 5s) and between them ~"}, nil},
		{"spike", workload.Spec{Kind: workload.Spike, Rate: 10, BurstSize: 50, BurstEvery: 10 * time.Second, BurstSpread: 10 * time.Millisecond}, 0,
			[]string{"; a burst of 50 requests within 10ms carries ~50.0k prompt tokens, ", " ms of the whole fleet's prefill capacity."}, []string{"in bursts ~"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := describeLoad(four, tc.spec, tr, tc.cached)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("no %q in %q", w, got)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(got, w) {
					t.Errorf("%q in %q", w, got)
				}
			}
		})
	}
}
