package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
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
// When a later turn quotes the request's answer (workload.Trace.Answers), the
// hashes run on over the answer's blocks, so that the engine caches them under
// the identities the next turn's prompt will carry, as vLLM V1 does. ids and
// text are scratch space, returned for reuse.
func simRequest(q workload.Request, i int, answer workload.Segment, ids []uint64, text []byte) (sim.Request, []uint64, []byte) {
	prompt := q.Prompt
	if answer.Tokens > 0 {
		prompt = append(slices.Clip(prompt), answer)
	}
	ids = workload.BlockIDs(ids[:0], prompt, blockTokens)
	text = blockText(text[:0], ids)
	hashes := prefix.Hashes(nil, text, blockChars, len(ids), prefix.Seed(q.Model, q.Adapter))
	return sim.Request{PromptTokens: q.PromptTokens(), BlockHashes: hashes, OutputTokens: max(1, q.OutputTokens), IgnoreEOS: true,
		Adapter: q.Adapter, Tag: uint64(i)}, ids, text
}

// Floor is the idle-engine floor of trace on fleet, as report.FloorDefinition
// states it.
func Floor(ctx context.Context, fleet simserver.FleetSpec, trace workload.Trace) (report.Floor, error) {
	warm, cold, cached, err := idleTTFTs(ctx, fleet, trace)
	if err != nil {
		return report.Floor{}, err
	}
	var w, c []time.Duration
	for i := range warm {
		if warm[i] >= 0 {
			w, c = append(w, warm[i]), append(c, cold[i])
		}
	}
	f := report.NewFloor(w, c)
	f.CachedShare = cached
	return f, nil
}

// idleTTFTs returns, per request of trace, its TTFT alone on an idle engine of
// the fleet's fastest kind for it: warm with a prefix cache that holds every
// block an earlier request computed, cold without one; −1 for a request no
// engine of the fleet can hold (RunSim fails it under every policy). cached
// is the share of their prompt tokens the warm replay found cached.
//
// Each kind of engine replays the whole trace, a request submitted at its
// arrival or, when the one before is still running, once it has finished, and
// stepped alone to its first token. Its cache cannot evict: it has room for
// every block that two requests share and for the longest request. Its LoRA
// slots hold every adapter of the trace, so only an adapter's first request
// loads it.
func idleTTFTs(ctx context.Context, fleet simserver.FleetSpec, trace workload.Trace) (warm, cold []time.Duration, cached float64, err error) {
	servers, _, err := fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, 0, err
	}
	reqs := make([]sim.Request, len(trace))
	arrivals := make([]time.Duration, len(trace))
	var ids []uint64
	var text []byte
	adapters := map[string]bool{}
	answers := trace.Answers()
	for i, q := range trace {
		reqs[i], ids, text = simRequest(q, i, answers[i], ids, text)
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
			return nil, nil, 0, err
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
				return nil, nil, 0, err
			}
			for i, r := range reqs {
				if i%1024 == 0 && ctx.Err() != nil {
					return nil, nil, 0, ctx.Err()
				}
				if r.PromptTokens+r.OutputTokens > maxLen {
					continue
				}
				ttft, err := alone(e, r, arrivals[i])
				if err != nil {
					return nil, nil, 0, fmt.Errorf("request %d on %s/%s: %w", i, cfg.GPU, cfg.ModelSize, err)
				}
				if pass.out[i] < 0 || ttft < pass.out[i] {
					pass.out[i] = ttft
				}
			}
			if st := e.Snapshot().Stats; !pass.cfg.DisablePrefixCaching && st.PrefixQueries > 0 {
				cached = max(cached, float64(st.PrefixHits)/float64(st.PrefixQueries))
			}
		}
	}
	return warm, cold, cached, nil
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

// capacity is what a fleet computes at most, in tokens a second, for a trace
// whose requests average prompt prompt tokens and output output tokens: prefill
// as full-budget steps of such prompts, decode as steps of the largest batch the
// KV cache holds (at most max_num_seqs sequences, each at its mean context,
// prompt + output/2), both by the engines' own cost model.
func capacity(fleet simserver.FleetSpec, prompt, output float64) (prefill, decode float64, err error) {
	servers, _, err := fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, 0, err
	}
	for _, o := range servers {
		e, err := sim.New(o.Engine)
		if err != nil {
			return 0, 0, err
		}
		cfg, cost := e.Config(), e.CostModel()
		budget := cfg.MaxNumBatchedTokens
		step := cost.StepTime(sim.StepWork{PrefillTokens: budget, AttnPairs: float64(budget) * prompt / 2})
		prefill += float64(budget) / step.Seconds()
		ctx := prompt + output/2
		batch := min(float64(cfg.MaxNumSeqs), math.Floor(float64(e.NumBlocks()*cfg.BlockSize)/ctx))
		if batch >= 1 {
			step = cost.StepTime(sim.StepWork{DecodeSeqs: int(batch), ContextTokens: int64(batch * ctx)})
			decode += batch / step.Seconds()
		}
	}
	return prefill, decode, nil
}

// offered is what a trace offers its fleet: tokens a second over the span of
// its arrivals against the fleet's capacity (capacity).
type offered struct {
	in, out         float64 // prompt and output tokens a second
	prefill, decode float64 // the fleet's capacity, tokens a second
	meanPrompt      float64
	// cached is the share of prompt tokens an earlier request computed
	// (report.Floor.CachedShare), which a cache can spare the prefill; 0
	// when below half a percent.
	cached float64
}

// offeredLoad is what trace offers fleet; false when its arrivals span no
// time or the fleet has no capacity to speak of.
func offeredLoad(fleet simserver.FleetSpec, trace workload.Trace, cached float64) (offered, bool, error) {
	if len(trace) < 2 {
		return offered{}, false, nil
	}
	span := trace[len(trace)-1].At - trace[0].At
	if span <= 0 {
		return offered{}, false, nil
	}
	var prompt, output float64
	for _, q := range trace {
		prompt += float64(q.PromptTokens())
		output += float64(q.OutputTokens)
	}
	n := float64(len(trace))
	prefill, decode, err := capacity(fleet, prompt/n, output/n)
	if err != nil || prefill == 0 || decode == 0 {
		return offered{}, false, err
	}
	o := offered{in: prompt / span, out: output / span, prefill: prefill, decode: decode, meanPrompt: prompt / n}
	if cached > 0.005 {
		o.cached = cached
	}
	return o, true, nil
}

// prefillShare is the share of the fleet's prefill capacity the prompt
// tokens still to compute take.
func (o offered) prefillShare() float64 { return o.in * (1 - o.cached) / o.prefill }

// fleetTime is the share of the fleet's time the trace takes: prefill and
// decode added, as describeLoad says it ("~73% of the fleet's time").
func (o offered) fleetTime() float64 { return o.prefillShare() + o.out/o.decode }

// describeLoad says what a trace offers its fleet in prefill and decode terms,
// against the fleet's capacity (capacity), over the span of its arrivals, and
// in bursts for a bursty workload or per burst for a spike one; cached is the
// share of prompt tokens an earlier request computed (report.Floor.CachedShare),
// which a cache can spare the prefill.
func describeLoad(fleet simserver.FleetSpec, spec workload.Spec, trace workload.Trace, cached float64) (string, error) {
	o, ok, err := offeredLoad(fleet, trace, cached)
	if !ok {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Load, from the trace and the engines' cost model: %s prompt tokens/s against a prefill capacity of ~%s/s (%.0f%%)",
		kilo(o.in), kilo(o.prefill), 100*o.in/o.prefill)
	if o.cached > 0 {
		fmt.Fprintf(&b, ", %s/s (%.0f%%) to compute once the %.0f%% of prompt tokens an earlier request computed are cached", kilo(o.in*(1-o.cached)), 100*o.prefillShare(), 100*o.cached)
	}
	share := o.fleetTime()
	fmt.Fprintf(&b, "; %s output tokens/s against a decode capacity of ~%s/s at full batch (%.0f%%); together ~%.0f%% of the fleet's time",
		kilo(o.out), kilo(o.decode), 100*o.out/o.decode, 100*share)
	if slices.ContainsFunc(trace, func(q workload.Request) bool { return q.Adapter != "" }) {
		b.WriteString(", not counting adapter loads")
	}
	if spec.Kind == workload.Bursty && spec.BurstFactor > 1 {
		on, off := spec.BurstOn.Seconds(), spec.BurstOff.Seconds()
		burst := spec.BurstFactor * (on + off) / (spec.BurstFactor*on + off) // the bursts' rate over the mean
		fmt.Fprintf(&b, ", in bursts ~%.0f%% (%.3g requests/s for %v) and between them ~%.0f%%",
			100*burst*share, burst*spec.Rate, spec.BurstOn, 100*burst/spec.BurstFactor*share)
	}
	if spec.Kind == workload.Spike && spec.BurstSize > 0 && spec.BurstSpread > 0 {
		tokens := float64(spec.BurstSize) * o.meanPrompt
		fmt.Fprintf(&b, "; a burst of %d requests within %v carries ~%s prompt tokens, %.0f ms of the whole fleet's prefill capacity",
			spec.BurstSize, spec.BurstSpread, kilo(tokens), 1000*tokens/o.prefill)
	}
	b.WriteString(".")
	return b.String(), nil
}

// kilo writes a rate of tokens as "47.1k", or whole below a thousand.
func kilo(v float64) string {
	if v < 1000 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
}
