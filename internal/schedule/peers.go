package schedule

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
)

// Two other routers' default rules, as profiles of the weighted picker, so
// that the bench compares kvgate with them on the same fleet and the same
// signals (v1alpha1.ProfileLLMDSticky and v1alpha1.ProfileDynamoKV).

// llm-d's defaults: llm-d-router's prefix-cache-affinity-filter and
// token-load-scorer, as the optimized-baseline guide configures them (the
// plugins' own defaults).
const (
	// LLMDAffinityThreshold is the share of the prompt's blocks an endpoint
	// must be believed to hold to be cache-warm ("sticky").
	LLMDAffinityThreshold = 0.80
	// LLMDMaxTTFTPenalty is how much longer the best warm endpoint's
	// estimated wait may be than the best cold one's before the filter lets
	// every endpoint through (maxTTFTPenaltyMs 18000).
	LLMDMaxTTFTPenalty = 18 * time.Second
	// LLMDPeakPrefillThroughput is the prompt tokens per second one endpoint
	// prefills, which turns its uncached tokens in flight into an estimated
	// wait: llm-d's default, calibrated for Qwen3-32B on 2×H100 (TP=2) as
	// 8192 / the idle TTFT of an 8192-token prompt (their calibrate.sh).
	LLMDPeakPrefillThroughput = 15928
	// LLMDTokenLoadThreshold is the token load at which the token-load
	// scorer reaches 0 (queueThresholdTokens, 4 Mi).
	LLMDTokenLoadThreshold = 4194304
)

// Affinity is llm-d's prefix-cache-affinity filter ("sticky until
// saturated"): it keeps the endpoints holding at least Threshold of the
// prompt's blocks, unless the least loaded of them would keep the request
// waiting more than MaxPenalty longer than the least loaded other endpoint,
// the wait being an endpoint's uncached prompt tokens in flight (PrefillWork:
// sent, no first token yet) over PeakPrefillThroughput. With no warm endpoint,
// or past the penalty, it keeps every endpoint. The zero value filters
// nothing.
type Affinity struct {
	Threshold             float64
	MaxPenalty            time.Duration // 0: stay on warm endpoints however loaded
	PeakPrefillThroughput float64       // tokens/s
}

// LLMDAffinity is llm-d's default gate.
var LLMDAffinity = Affinity{Threshold: LLMDAffinityThreshold, MaxPenalty: LLMDMaxTTFTPenalty, PeakPrefillThroughput: LLMDPeakPrefillThroughput}

// warm says whether e holds enough of the prompt to keep the request.
func (a Affinity) warm(e *Endpoint) bool { return e.PrefixMatch >= a.Threshold }

// prefixAffinity applies the profile's Affinity.
func (p *Weighted) prefixAffinity(_ Request, eps []Endpoint) []Endpoint {
	a := p.affinity
	if a.Threshold <= 0 || len(eps) <= 1 {
		return eps
	}
	warm, cold := math.Inf(1), math.Inf(1)
	for i := range eps {
		if e := &eps[i]; a.warm(e) {
			warm = min(warm, e.PrefillWork)
		} else {
			cold = min(cold, e.PrefillWork)
		}
	}
	if math.IsInf(warm, 1) {
		return eps
	}
	// llm-d compares estimated waits in ms; the load alone is the same
	// comparison, penalty × throughput tokens (286,704 by default).
	if a.MaxPenalty > 0 && !math.IsInf(cold, 1) && (warm-cold)/a.PeakPrefillThroughput > a.MaxPenalty.Seconds() {
		return eps
	}
	return keep(eps, a.warm)
}

// TokenLoad is llm-d's token-load scorer: 1 − the endpoint's token load over
// LLMDTokenLoadThreshold, at least 0, the load being the uncached prompt
// tokens in flight there (PrefillWork) and this request's own uncached
// tokens there. Alone in a profile it sends the request where the least
// prefill is queued.
type TokenLoad struct{}

var _ Scorer = TokenLoad{}

// Name implements Scorer.
func (TokenLoad) Name() v1alpha1.ScorerName { return v1alpha1.ScorerTokenLoad }

// Score implements Scorer.
func (TokenLoad) Score(req Request, eps []Endpoint, out []float64) {
	for i := range eps {
		e := &eps[i]
		load := max(e.PrefillWork, 0) + max(req.PromptTokens, 0)*(1-min(max(e.PrefixMatch, 0), 1))
		out[i] = 1 - min(load, LLMDTokenLoadThreshold)/LLMDTokenLoadThreshold
	}
}

// Dynamo's KV router defaults (lib/kv-router's KvRouterConfig).
const (
	// DynamoOverlapCredit is overlap_score_credit, formerly
	// overlap_score_weight: the prefill blocks a cached block saves.
	DynamoOverlapCredit = 1.0
	// DynamoPrefillLoadScale is prefill_load_scale, applied to the prefill
	// blocks after the credit.
	DynamoPrefillLoadScale = 1.0
	// DynamoBlockSize is the block size, tokens, the cost counts in when
	// the endpoint does not publish its own (vLLM's default).
	DynamoBlockSize = 16
)

// KVCost is Dynamo's KV-router cost (router_temperature 0: lowest cost wins,
// ties at random): the prefill blocks the request would wait for at the
// endpoint plus the endpoint's active KV blocks, min-max normalised so that
// the cheapest scores 1 (KVCostBlocks).
type KVCost struct{}

var _ Scorer = KVCost{}

// Name implements Scorer.
func (KVCost) Name() v1alpha1.ScorerName { return v1alpha1.ScorerKVCost }

// Score implements Scorer.
func (KVCost) Score(req Request, eps []Endpoint, out []float64) {
	for i := range eps {
		out[i] = KVCostBlocks(req, &eps[i])
	}
	minMaxLow(out, 0)
}

// KVCostBlocks is Dynamo's cost of sending req to e, in KV blocks:
//
//	scale × max(0, (prefill in flight + prompt) / block − credit × cached blocks)
//	  + active blocks + the prompt's blocks not cached
//
// Dynamo counts in flight the uncached prompt tokens it routed that have no
// first token yet, which is PrefillWork. Its active blocks are its own count
// of the blocks every sequence it routed to the worker holds, from dispatch to
// completion; kvgate keeps no such count, so they are approximated by the
// engine's KV usage × its blocks (which the gateway raises by its own
// dispatches between scrapes): that also counts output blocks, and misses
// prompts still waiting for blocks. The request's own new blocks are, in
// Dynamo, those not shared with the worker's active sequences; here, those
// not believed cached.
func KVCostBlocks(req Request, e *Endpoint) float64 {
	pub := e.Published()
	block := float64(DynamoBlockSize)
	if pub.Has(engine.SignalBlocks) && e.BlockSize > 0 {
		block = float64(e.BlockSize)
	}
	prompt := max(req.PromptTokens, 0)
	blocks := math.Ceil(prompt / block)
	cached := min(max(e.PrefixMatch, 0), 1) * blocks
	prefill := DynamoPrefillLoadScale * max(0, (max(e.PrefillWork, 0)+prompt)/block-DynamoOverlapCredit*cached)
	active := 0.0
	if pub.Has(engine.SignalKVUsage | engine.SignalBlocks) {
		active = min(max(e.KVUsage, 0), 1) * float64(e.NumBlocks)
	}
	return prefill + active + blocks - cached
}
