package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// simRequest is the engine's view of trace request i as a replay submits it:
// the prompt's 16-token blocks, hashed as the gateway's prefix index hashes the
// text that stands for them (blockText), the trace's output length, tagged i.
// ids and text are scratch space, returned for reuse.
func simRequest(q workload.Request, i int, ids []uint64, text []byte) (sim.Request, []uint64, []byte) {
	ids = workload.BlockIDs(ids[:0], q.Prompt, blockTokens)
	text = blockText(text[:0], ids)
	hashes := prefix.Hashes(nil, text, blockChars, len(ids), prefix.Seed(q.Model, q.Adapter))
	return sim.Request{PromptTokens: q.PromptTokens(), BlockHashes: hashes, OutputTokens: max(1, q.OutputTokens), IgnoreEOS: true,
		Adapter: q.Adapter, Tag: uint64(i)}, ids, text
}

// Floor is the idle-engine floor of trace on fleet, as report.FloorDefinition
// states it.
func Floor(ctx context.Context, fleet simserver.FleetSpec, trace workload.Trace) (report.Floor, error) {
	warm, cold, err := idleTTFTs(ctx, fleet, trace)
	if err != nil {
		return report.Floor{}, err
	}
	var w, c []time.Duration
	for i := range warm {
		if warm[i] >= 0 {
			w, c = append(w, warm[i]), append(c, cold[i])
		}
	}
	return report.NewFloor(w, c), nil
}

// idleTTFTs returns, per request of trace, its TTFT alone on an idle engine of
// the fleet's fastest kind for it: warm with a prefix cache that holds every
// block an earlier request computed, cold without one; −1 for a request no
// engine of the fleet can hold (RunSim fails it under every policy).
//
// Each kind of engine replays the whole trace, a request submitted at its
// arrival or, when the one before is still running, once it has finished, and
// stepped alone to its first token. Its cache cannot evict: it has room for
// every block that two requests share and for the longest request. Its LoRA
// slots hold every adapter of the trace, so only an adapter's first request
// loads it.
func idleTTFTs(ctx context.Context, fleet simserver.FleetSpec, trace workload.Trace) (warm, cold []time.Duration, err error) {
	servers, _, err := fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, err
	}
	reqs := make([]sim.Request, len(trace))
	arrivals := make([]time.Duration, len(trace))
	var ids []uint64
	var text []byte
	adapters := map[string]bool{}
	for i, q := range trace {
		reqs[i], ids, text = simRequest(q, i, ids, text)
		arrivals[i] = time.Duration(q.At * float64(time.Second))
		if q.Adapter != "" {
			adapters[q.Adapter] = true
		}
	}
	shared, longest := sharedPrefixes(reqs)
	warm, cold = make([]time.Duration, len(trace)), make([]time.Duration, len(trace))
	for i := range warm {
		warm[i], cold[i] = -1, -1
	}
	kinds := map[sim.Config]bool{}
	for _, o := range servers {
		cfg := o.Engine
		cfg.Seed = 0 // engines of one kind differ only in their seed
		if kinds[cfg] {
			continue
		}
		kinds[cfg] = true
		e, err := sim.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		maxLen := e.MaxModelLen()
		cfg.MaxModelLen = maxLen
		cfg.MaxLoRAs = max(cfg.MaxLoRAs, len(adapters))
		coldCfg := cfg
		coldCfg.DisablePrefixCaching = true
		cfg.NumGPUBlocks = max(shared+longest, (maxLen+blockTokens-1)/blockTokens) + 1
		for _, pass := range []struct {
			cfg sim.Config
			out []time.Duration
		}{{cfg, warm}, {coldCfg, cold}} {
			e, err := sim.New(pass.cfg)
			if err != nil {
				return nil, nil, err
			}
			for i, r := range reqs {
				if i%1024 == 0 && ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				if r.PromptTokens+r.OutputTokens > maxLen {
					continue
				}
				ttft, err := alone(e, r, arrivals[i])
				if err != nil {
					return nil, nil, fmt.Errorf("request %d on %s/%s: %w", i, cfg.GPU, cfg.ModelSize, err)
				}
				if pass.out[i] < 0 || ttft < pass.out[i] {
					pass.out[i] = ttft
				}
			}
		}
	}
	return warm, cold, nil
}

// sharedPrefixes cuts each request's block hashes to the blocks it shares with
// another request: a block no other request holds can never be hit, so the
// replay's cache needs room only for the shared ones (it returns how many
// distinct blocks they are) and for the longest request (in blocks, with its
// first output token). The hashes are chained, so two prompts share exactly the
// common head of their hash lists: sorted, a request shares the most with a
// neighbour, and the distinct blocks of the cut lists are their lengths less
// what each shares with the one before.
func sharedPrefixes(reqs []sim.Request) (shared, longest int) {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
		longest = max(longest, (reqs[i].PromptTokens+blockTokens)/blockTokens+1)
	}
	slices.SortFunc(order, func(a, b int) int { return slices.Compare(reqs[a].BlockHashes, reqs[b].BlockHashes) })
	lcp := make([]int, len(order)) // lcp[k]: common head of order[k-1] and order[k]
	for k := 1; k < len(order); k++ {
		a, b := reqs[order[k-1]].BlockHashes, reqs[order[k]].BlockHashes
		n := 0
		for n < min(len(a), len(b)) && a[n] == b[n] {
			n++
		}
		lcp[k] = n
	}
	cut := make([]int, len(order))
	for k := range order {
		cut[k] = lcp[k]
		if k+1 < len(order) {
			cut[k] = max(cut[k], lcp[k+1])
		}
	}
	for k, i := range order {
		reqs[i].BlockHashes = reqs[i].BlockHashes[:cut[k]]
		shared += cut[k]
		if k > 0 {
			shared -= min(cut[k], cut[k-1], lcp[k])
		}
	}
	return shared, longest
}

// alone runs r on the idle engine e from at, or from the engine's clock when
// that is later, to its first token, and returns its TTFT.
func alone(e *sim.Engine, r sim.Request, at time.Duration) (time.Duration, error) {
	r.OutputTokens, r.MaxTokens = 1, 0 // the first token is all a floor needs
	e.AdvanceTo(at)
	s, err := e.SubmitAt(r, e.Now())
	if err != nil {
		return 0, err
	}
	for s.Finish == "" {
		if e.Step().Idle {
			return 0, fmt.Errorf("engine idle before the first token")
		}
	}
	return s.FirstToken - s.Arrival, nil
}
