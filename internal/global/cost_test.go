package global

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
)

// phaseResult is what one phase of open-loop traffic saw.
type phaseResult struct {
	requests, errors int
	share            map[string]float64
	ttftP95          time.Duration
}

// openLoop sends streaming requests at Poisson arrivals of rate per second for
// d, and reports where they went and their times to first token.
func openLoop(t testing.TB, base string, rate float64, d time.Duration, seed uint64) phaseResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	c := sdk(base)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var ttfts []time.Duration
	res := phaseResult{share: map[string]float64{}}
	count := map[string]int{}
	end := time.Now().Add(d)
	for next := time.Now(); next.Before(end); next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))) {
		time.Sleep(time.Until(next))
		wg.Go(func() {
			var member string
			start := time.Now()
			s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("summarise the report")},
				MaxTokens: openai.Int(40)}, memberOf(&member))
			var ttft time.Duration
			for s.Next() {
				if ttft == 0 {
					ttft = time.Since(start)
				}
			}
			err := s.Err()
			_ = s.Close()
			mu.Lock()
			defer mu.Unlock()
			res.requests++
			if err != nil {
				res.errors++
				return
			}
			count[member]++
			ttfts = append(ttfts, ttft)
		})
	}
	wg.Wait()
	for m, n := range count {
		res.share[m] = float64(n) / float64(max(1, res.requests-res.errors))
	}
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		res.ttftP95 = ttfts[len(ttfts)*95/100]
	}
	return res
}

// TestCostShaping: the cheap member takes the traffic while it keeps the SLO;
// when load pushes its TTFT to the SLO, traffic spills to the dear member; the
// same traffic routed price-blind (by load and capacity alone) costs more.
//
// The cheap member is one A10G with room for two sequences, the dear one two
// H100s with room for two each, priced 1 and 4 per million tokens; the SLO is
// 800 ms. Each mode gets 6 s at 1 request/s, 6 s at 2 and 4 s at 6.
func TestCostShaping(t *testing.T) {
	if testing.Short() {
		t.Skip("32 s of live traffic")
	}
	const slo = 800 * time.Millisecond
	type run struct {
		low, mid, high phaseResult
		cost           float64
	}
	results := map[bool]run{}
	for _, blind := range []bool{false, true} {
		// Fresh members for each mode: the first run's load must not linger
		// in the second's TTFT windows.
		cheap := startTier1(t, 1, simserver.Options{Engine: sim.Config{GPU: "a10g", ModelSize: "8b", MaxNumSeqs: 2}})
		dear := startTier1(t, 2, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 2}})
		routing := steadyRouting()
		routing.DefaultTTFTSLO = d(slo)
		routing.PriceBlind = blind
		dearMember := dear.member("dear", 4)
		w := 2.0 // two servers
		dearMember.Weight = &w
		r, base := startRouter(t, routerConfig(routing, cheap.member("cheap", 1), dearMember), Options{})
		var res run
		res.low = openLoop(t, base, 1, 6*time.Second, 1)
		res.mid = openLoop(t, base, 2, 6*time.Second, 2)
		res.high = openLoop(t, base, 6, 4*time.Second, 3)
		res.cost = r.metric(t, "kvgate_global_cost_total")
		results[blind] = res
		cheap.kill()
		dear.kill()
		t.Logf("price-blind=%v: 1 req/s: cheap share %.2f, TTFT p95 %v; 2 req/s: cheap share %.2f, TTFT p95 %v; 6 req/s: cheap share %.2f, TTFT p95 %v; errors %d; cost %.6f",
			blind, res.low.share["cheap"], res.low.ttftP95, res.mid.share["cheap"], res.mid.ttftP95, res.high.share["cheap"], res.high.ttftP95,
			res.high.errors+res.mid.errors+res.low.errors, res.cost)
	}
	aware, blind := results[false], results[true]
	if aware.low.share["cheap"] < 0.6 {
		t.Errorf("at low load the cheap member took %.2f, want most", aware.low.share["cheap"])
	}
	for name, ph := range map[string]phaseResult{"1 req/s": aware.low, "2 req/s": aware.mid, "6 req/s": aware.high} {
		// Spilling starts at 80% of the SLO and is complete at 120%; the bound
		// leaves room for a loaded test machine.
		if ph.ttftP95 > 2*slo {
			t.Errorf("at %s the TTFT p95 was %v: the SLO (%v) did not bind", name, ph.ttftP95, slo)
		}
	}
	if s := aware.high.share["cheap"]; s > 0.8 || s < 0.1 {
		t.Errorf("at high load the cheap member took %.2f: want it full but the rest spilled", s)
	}
	if aware.cost >= blind.cost {
		t.Errorf("cost-aware routing cost %.6f, price-blind %.6f", aware.cost, blind.cost)
	} else {
		t.Logf("cost saved against price-blind routing: %.1f%%", 100*(1-aware.cost/blind.cost))
	}
	if n := aware.low.errors + aware.mid.errors + aware.high.errors; n > 0 {
		t.Errorf("%d requests failed", n)
	}
}
