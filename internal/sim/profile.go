package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// GPU describes one accelerator generation by the three figures the cost model needs.
// Figures are the vendor's data-sheet values (dense, without sparsity).
type GPU struct {
	Name         string
	MemoryGB     float64 // capacity as the driver reports it, decimal GB
	BandwidthTBs float64 // memory bandwidth, TB/s
	BF16TFLOPs   float64 // dense BF16 tensor throughput
	// Efficiencies observed for vLLM on this generation: the share of peak bandwidth
	// a decode step reaches and the share of peak FLOPs a prefill reaches. They are
	// the calibration knobs (docs/simulator.md).
	BandwidthEff float64
	ComputeEff   float64
	// StepOverhead is the fixed host-side cost of one engine step (scheduling, kernel
	// launches, sampling set-up), larger on slower hosts.
	StepOverhead time.Duration
}

// Model describes a transformer by the figures that decide weight size and KV size.
type Model struct {
	Name        string
	ParamsB     float64 // parameters, billions
	Layers      int
	KVHeads     int
	HeadDim     int
	Hidden      int
	MaxModelLen int // the model's native context length
}

// KVBytesPerToken is the KV-cache footprint of one token in BF16 (K and V per layer).
func (m Model) KVBytesPerToken() float64 {
	return float64(2*m.Layers*m.KVHeads*m.HeadDim) * 2
}

// WeightBytes is the BF16 size of the weights.
func (m Model) WeightBytes() float64 { return m.ParamsB * 1e9 * 2 }

var gpus = map[string]GPU{
	"h100": {Name: "h100", MemoryGB: 85.5, BandwidthTBs: 3.35, BF16TFLOPs: 989, BandwidthEff: 0.75, ComputeEff: 0.55, StepOverhead: 700 * time.Microsecond},
	"a100": {Name: "a100", MemoryGB: 85.2, BandwidthTBs: 2.039, BF16TFLOPs: 312, BandwidthEff: 0.70, ComputeEff: 0.55, StepOverhead: 900 * time.Microsecond},
	"l40s": {Name: "l40s", MemoryGB: 48.3, BandwidthTBs: 0.864, BF16TFLOPs: 362, BandwidthEff: 0.80, ComputeEff: 0.45, StepOverhead: 900 * time.Microsecond},
	"a10g": {Name: "a10g", MemoryGB: 24.1, BandwidthTBs: 0.600, BF16TFLOPs: 125, BandwidthEff: 0.85, ComputeEff: 0.45, StepOverhead: 1200 * time.Microsecond},
}

// BatchDefaults are vLLM's defaults for max_num_batched_tokens and max_num_seqs on
// this GPU, as the V1 engine picks them when neither is set
// (EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py): a GPU of at least
// 70 GiB whose name does not contain "a100" (an H100, H200, MI300X) gets 8192 tokens
// and 1024 sequences for the OpenAI API server and 16384 and 1024 for the offline
// LLM class; every other GPU gets 2048 and 256 for the server and 8192 and 256
// offline. A100s are excluded by name because the larger budget lowered their
// throughput (vLLM PR 17885).
func (g GPU) BatchDefaults(offline bool) (maxNumBatchedTokens, maxNumSeqs int) {
	const gib = 1 << 30
	large := g.MemoryGB*1e9 >= 70*gib && !strings.Contains(strings.ToLower(g.Name), "a100")
	switch {
	case large && offline:
		return 16384, 1024
	case large:
		return 8192, 1024
	case offline:
		return 8192, 256
	default:
		return 2048, 256
	}
}

var models = map[string]Model{
	// Llama-3.1-8B
	"8b": {Name: "8b", ParamsB: 8.03, Layers: 32, KVHeads: 8, HeadDim: 128, Hidden: 4096, MaxModelLen: 131072},
	// Qwen2.5-32B
	"32b": {Name: "32b", ParamsB: 32.8, Layers: 64, KVHeads: 8, HeadDim: 128, Hidden: 5120, MaxModelLen: 32768},
	// Llama-3.1-70B
	"70b": {Name: "70b", ParamsB: 70.6, Layers: 80, KVHeads: 8, HeadDim: 128, Hidden: 8192, MaxModelLen: 131072},
}

// GPUNames lists the known GPU profiles.
func GPUNames() []string { return sortedKeys(gpus) }

// ModelSizes lists the known model sizes.
func ModelSizes() []string { return sortedKeys(models) }

// LookupGPU returns the named GPU profile.
func LookupGPU(name string) (GPU, error) {
	g, ok := gpus[strings.ToLower(name)]
	if !ok {
		return GPU{}, fmt.Errorf("unknown gpu %q (known: %s)", name, strings.Join(GPUNames(), ", "))
	}
	return g, nil
}

// LookupModel returns the named model size.
func LookupModel(name string) (Model, error) {
	m, ok := models[strings.ToLower(name)]
	if !ok {
		return Model{}, fmt.Errorf("unknown model size %q (known: %s)", name, strings.Join(ModelSizes(), ", "))
	}
	return m, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// runtimeReserveGB is what vLLM keeps per GPU besides weights and KV cache
// (activations of a full-budget step, CUDA graphs, allocator, CUDA context).
// Calibrated on a published block count: Llama-3-8B on one 48 GiB A6000 at 0.9
// utilisation got 13,248 blocks (27.8 GB), leaving 2.5 GB.
const runtimeReserveGB = 2.5

// Hardware is a model deployed on TensorParallel GPUs of one kind: what the cost
// model and the KV-cache size are derived from.
type Hardware struct {
	GPU            GPU
	Model          Model
	TensorParallel int
	// GPUMemoryUtilization is the share of each GPU's memory vLLM may use (its
	// --gpu-memory-utilization, default 0.9).
	GPUMemoryUtilization float64
}

// KVCapacityTokens is how many tokens of KV cache fit once weights are loaded, or an
// error when the model does not fit at all.
func (h Hardware) KVCapacityTokens() (int, error) {
	tp := float64(h.TensorParallel)
	usable := h.GPU.MemoryGB*1e9*h.GPUMemoryUtilization*tp - h.Model.WeightBytes() - runtimeReserveGB*1e9*tp
	tokens := usable / h.Model.KVBytesPerToken()
	// A deployment that cannot hold one 4k-token request is not one vLLM would start.
	const minTokens = 4096
	if tokens < minTokens {
		need := (h.Model.WeightBytes() + (runtimeReserveGB*tp)*1e9 + minTokens*h.Model.KVBytesPerToken()) / (h.GPU.MemoryGB * 1e9 * h.GPUMemoryUtilization)
		return 0, fmt.Errorf("model size %s (%.0f GB of weights) does not fit on %d x %s (%.0f GB each at %.0f%% utilisation): needs tensor parallelism of at least %d",
			h.Model.Name, h.Model.WeightBytes()/1e9, h.TensorParallel, h.GPU.Name, h.GPU.MemoryGB, h.GPUMemoryUtilization*100, nextPow2(int(math.Ceil(need))))
	}
	return int(tokens), nil
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// CostModel gives the duration of one engine step. It is a roofline model of a
// transformer forward pass, split into the four terms the issue asks for:
//
//	step = overhead + TP all-reduce
//	     + max(weights / (bandwidth·eff), tokens · 2·params / (FLOPs·eff))   dense layers
//	     + decodeSeqs · PerDecodeSeq                                         sampling, bookkeeping
//	     + contextTokens · KVBytesPerToken / (bandwidth·eff)                 attention KV reads
//	     + prefillTokens · ctx · attnFLOPs / (FLOPs·eff)                      prefill attention
//
// where tokens = prefill tokens + decoding sequences. Everything is divided across
// TensorParallel GPUs.
type CostModel struct {
	Overhead       time.Duration
	WeightRead     time.Duration // streaming the weights once (memory bound floor of a step)
	PerDenseToken  float64       // ns of dense-layer compute per token in the step
	PerDecodeSeq   float64       // ns per decoding sequence
	PerContextRead float64       // ns per context token read by a decoding sequence
	PerAttnPair    float64       // ns per (prefill token × context token) pair
	AllReduce      time.Duration // per step, when TensorParallel > 1
}

// perDecodeSeqNs is the per-sequence host cost of a decode step (sampling, detokenising,
// output processing) measured on vLLM V1 as roughly 10 µs.
const perDecodeSeqNs = 10_000

// allReducePerLayer is the latency of a layer's two NVLink all-reduces with tensor
// parallelism at small batch.
const allReducePerLayer = 50 * time.Microsecond

// NewCostModel derives the cost model of a deployment from its hardware figures.
func NewCostModel(h Hardware) CostModel {
	tp := float64(h.TensorParallel)
	bw := h.GPU.BandwidthTBs * 1e12 * h.GPU.BandwidthEff * tp // bytes/s across the group
	flops := h.GPU.BF16TFLOPs * 1e12 * h.GPU.ComputeEff * tp
	c := CostModel{
		Overhead:       h.GPU.StepOverhead,
		WeightRead:     time.Duration(h.Model.WeightBytes() / bw * 1e9),
		PerDenseToken:  2 * h.Model.ParamsB * 1e9 / flops * 1e9,
		PerDecodeSeq:   perDecodeSeqNs,
		PerContextRead: h.Model.KVBytesPerToken() / bw * 1e9,
		// QK^T and PV: 2 matmuls × 2 FLOPs × hidden per layer per (query, key) pair.
		PerAttnPair: 4 * float64(h.Model.Layers*h.Model.Hidden) / flops * 1e9,
	}
	if h.TensorParallel > 1 {
		c.AllReduce = time.Duration(h.Model.Layers) * allReducePerLayer
	}
	return c
}

// StepWork is what one engine step computes.
type StepWork struct {
	PrefillTokens int     // prompt tokens computed this step (all chunks)
	AttnPairs     float64 // Σ over prefill chunks of chunk × (prior context + chunk/2)
	DecodeSeqs    int     // sequences producing a token from a one-token step
	ContextTokens int64   // Σ context length of decoding sequences
}

// StepTime is the duration of a step doing w.
func (c CostModel) StepTime(w StepWork) time.Duration {
	tokens := float64(w.PrefillTokens + w.DecodeSeqs)
	dense := math.Max(float64(c.WeightRead), tokens*c.PerDenseToken)
	ns := float64(c.Overhead+c.AllReduce) + dense +
		float64(w.DecodeSeqs)*c.PerDecodeSeq +
		float64(w.ContextTokens)*c.PerContextRead +
		w.AttnPairs*c.PerAttnPair
	return time.Duration(ns)
}
