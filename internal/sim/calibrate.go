package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// The calibration set: figures published for real deployments, each with the way the
// simulator measures the same figure in virtual time. docs/simulator.md prints the
// table (`kvgate sim calibrate`), and TestCalibration holds every figure within ±25%.

// Reference is one published figure.
type Reference struct {
	Deployment Deployment
	Figure     string  // what is measured, in words
	Published  float64 // in Unit
	Unit       string  // "ms", "req/s" or "tok/s"
	Source     string  // where it was published, with the engine and conditions that differ
	Measure    func(Config) (float64, error)
	// Excluded, when set, says why the figure is shown but not held to ±25%.
	Excluded string
}

// Deployment names one GPU × model size × tensor-parallel combination.
type Deployment struct {
	GPU, ModelSize string
	TensorParallel int
}

func (d Deployment) String() string {
	return fmt.Sprintf("%s %s tp%d", d.GPU, d.ModelSize, d.TensorParallel)
}

// Config returns the engine configuration of the deployment with defaults.
func (d Deployment) Config() Config {
	return Config{GPU: d.GPU, ModelSize: d.ModelSize, TensorParallel: d.TensorParallel}
}

// References are the published figures the simulator is calibrated against.
var References = []Reference{
	{Deployment{"h100", "8b", 1}, "batch 8, 32 in / 128 out, end-to-end latency", 997.5, "ms",
		"vLLM nightly CI benchmark_latency, Llama-3.1-8B", batchLatencyMs(8, 32, 128), ""},
	{Deployment{"h100", "8b", 1}, "ITL at concurrency 1", 6.5, "ms",
		"vLLM 0.21 serving benchmark, Llama-3.1-8B fp16 (weak source)", closedLoop(1, 512, 128, itlMs), ""},
	{Deployment{"h100", "8b", 1}, "TPOT at concurrency 4, ShareGPT-like 233 in / 221 out", 7.38, "ms",
		"GPUStack perf lab, vLLM 0.11.0, Qwen3-8B bf16", closedLoop(4, 233, 221, itlMs), ""},
	{Deployment{"h100", "8b", 1}, "200 ShareGPT prompts, offline throughput", 19.5, "req/s",
		"vLLM nightly CI benchmark_throughput, Llama-3.1-8B", offlineShareGPT(200, reqPerSec), ""},
	{Deployment{"h100", "32b", 1}, "1000 ShareGPT prompts, output throughput", 1131.6, "tok/s",
		"GPUStack perf lab, vLLM 0.11.0, Qwen3-32B bf16 on one H100", offlineShareGPT(1000, tokPerSec),
		"max model length and the output lengths of a reasoning model are not stated; KV capacity and batch size cannot be matched"},
	{Deployment{"h100", "70b", 4}, "batch 8, 32 in / 128 out, end-to-end latency", 2444.5, "ms",
		"vLLM nightly CI benchmark_latency, Llama-3-70B", batchLatencyMs(8, 32, 128), ""},
	{Deployment{"h100", "70b", 4}, "200 ShareGPT prompts, offline throughput", 8.86, "req/s",
		"vLLM nightly CI benchmark_throughput, Llama-3-70B", offlineShareGPT(200, reqPerSec), ""},
	{Deployment{"h100", "70b", 4}, "TTFT of a 7000-token prompt at concurrency 1", 540, "ms",
		"NVIDIA NIM 1.1.2 (TensorRT-LLM), Llama-3.1-70B fp16", ttftMs(7000), ""},
	{Deployment{"a100", "8b", 1}, "batch 8, 32 in / 128 out, end-to-end latency", 1585.4, "ms",
		"vLLM nightly CI benchmark_latency, Llama-3.1-8B, A100-SXM4-80GB", batchLatencyMs(8, 32, 128), ""},
	{Deployment{"a100", "8b", 1}, "200 ShareGPT prompts, offline throughput", 11.05, "req/s",
		"vLLM nightly CI benchmark_throughput, Llama-3.1-8B, A100-SXM4-80GB", offlineShareGPT(200, reqPerSec), ""},
	{Deployment{"a100", "8b", 1}, "TTFT of a 500-token prompt at concurrency 1", 48.3, "ms",
		"NVIDIA NIM 1.10.1 (TensorRT-LLM), Llama-3.1-8B architecture, bf16, A100 80GB", ttftMs(500), ""},
	// A validation run on one A100 80GB (N=1): vLLM 0.8.5, --max-num-seqs 64, Qwen2.5-7B
	// fp16 as the 8B-class model, ~200 prompt tokens and 128 output tokens; ITL is
	// derived from the published per-stream tokens/s.
	{Deployment{"a100", "8b", 1}, "ITL at concurrency 1, ~200 in / 128 out", 1000 / 72.1, "ms",
		qwenA100, closedLoop(1, 200, 128, itlMs), ""},
	{Deployment{"a100", "8b", 1}, "output throughput at concurrency 16, ~200 in / 128 out", 950, "tok/s",
		qwenA100, closedLoop(16, 200, 128, runTokPerSec), ""},
	{Deployment{"a100", "8b", 1}, "ITL at concurrency 64, ~200 in / 128 out", 1000 / 40.1, "ms",
		qwenA100, closedLoop(64, 200, 128, itlMs), ""},
	{Deployment{"a100", "8b", 1}, "output throughput at concurrency 64, ~200 in / 128 out", 2564, "tok/s",
		qwenA100, closedLoop(64, 200, 128, runTokPerSec), ""},
	{Deployment{"a10g", "8b", 1}, "TTFT at concurrency 1, 550 in / 150 out", 137.3, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(1, 550, 150, ttftOfRun)), ""},
	{Deployment{"a10g", "8b", 1}, "ITL at concurrency 1, 550 in / 150 out", 30.65, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(1, 550, 150, itlMs)), ""},
	{Deployment{"a10g", "8b", 1}, "TTFT at concurrency 4, 550 in / 150 out", 171.4, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(4, 550, 150, ttftOfRun)), ""},
	{Deployment{"a10g", "8b", 1}, "ITL at concurrency 4, 550 in / 150 out", 33.9, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(4, 550, 150, itlMs)), ""},
	// At nominal concurrency 16 and 64 the client (on the same 8-vCPU host) kept fewer
	// requests in flight: Little's law on the published figures (L = throughput/150 ×
	// (TTFT + 149·ITL)) gives 12.9 and 20.6, so the simulator runs 13 and 21.
	{Deployment{"a10g", "8b", 1}, "ITL at concurrency 16 (13 in flight), 550 in / 150 out", 42.7, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(13, 550, 150, itlMs)), ""},
	{Deployment{"a10g", "8b", 1}, "TTFT at concurrency 16 (13 in flight), 550 in / 150 out", 302.7, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(13, 550, 150, ttftOfRun)),
		clientLimited},
	{Deployment{"a10g", "8b", 1}, "output throughput at concurrency 16 (13 in flight)", 289.9, "tok/s",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(13, 550, 150, runTokPerSec)), ""},
	{Deployment{"a10g", "8b", 1}, "ITL at concurrency 64 (21 in flight), 550 in / 150 out", 61.7, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(21, 550, 150, itlMs)), ""},
	{Deployment{"a10g", "8b", 1}, "TTFT at concurrency 64 (21 in flight), 550 in / 150 out", 1080, "ms",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(21, 550, 150, ttftOfRun)),
		clientLimited},
	{Deployment{"a10g", "8b", 1}, "output throughput at concurrency 64 (21 in flight)", 301.2, "tok/s",
		"llmperf on g5.2xlarge, vLLM 0.4.3, Llama-3-8B bf16", llmperfV0(closedLoop(21, 550, 150, runTokPerSec)), ""},
}

// llmperfV0 runs a measure as the A10G llmperf source's vLLM 0.4.3 did: the V0
// engine with chunked prefill off, whose step budget defaulted to
// max(max_model_len, 2048), 8192 tokens for Llama-3-8B.
func llmperfV0(m func(Config) (float64, error)) func(Config) (float64, error) {
	return func(cfg Config) (float64, error) {
		cfg.MaxNumBatchedTokens = 8192
		return m(cfg)
	}
}

const qwenA100 = "inference-bench A100 validation, vLLM 0.8.5, Qwen2.5-7B fp16 (8B-class proxy)"

const clientLimited = "the client held fewer requests than asked; its TTFT includes time spent queued inside the client"

// runStats summarises a measured run.
type runStats struct {
	meanTTFT, meanITL time.Duration
	makespan          time.Duration
	requests, outputs int
}

func itlMs(r runStats) float64        { return ms(r.meanITL) }
func ttftOfRun(r runStats) float64    { return ms(r.meanTTFT) }
func runTokPerSec(r runStats) float64 { return float64(r.outputs) / r.makespan.Seconds() }
func reqPerSec(r runStats) float64    { return float64(r.requests) / r.makespan.Seconds() }
func tokPerSec(r runStats) float64    { return runTokPerSec(r) }
func ms(d time.Duration) float64      { return d.Seconds() * 1000 }

func ttftMs(prompt int) func(Config) (float64, error) {
	return func(cfg Config) (float64, error) {
		d, err := MeasureTTFT(cfg, prompt)
		return ms(d), err
	}
}

// batchLatencyMs runs vLLM's benchmark_latency: one batch submitted at once, through
// the LLM class (offline batch defaults).
func batchLatencyMs(batch, in, out int) func(Config) (float64, error) {
	return func(cfg Config) (float64, error) {
		cfg.Offline = true
		e, err := New(cfg)
		if err != nil {
			return 0, err
		}
		for range batch {
			if _, err := e.Submit(Request{PromptTokens: in, MaxTokens: out, IgnoreEOS: true}); err != nil {
				return 0, err
			}
		}
		for e.Busy() {
			e.Step()
		}
		return ms(e.Now()), nil
	}
}

// closedLoop keeps conc requests in flight, as llmperf and benchmark_serving
// --max-concurrency do, for 4·conc requests (at least 8) after one warm-up round, and
// reduces the run with f. Lengths vary as llmperf draws them (prompt σ = 27% of the
// mean, output σ = 10 tokens), which keeps the clients from marching in lockstep.
func closedLoop(conc, in, out int, f func(runStats) float64) func(Config) (float64, error) {
	return func(cfg Config) (float64, error) {
		e, err := New(cfg)
		if err != nil {
			return 0, err
		}
		rng := rand.New(rand.NewPCG(3, 4))
		total := conc + max(4*conc, 8)
		submit := func() (*Seq, error) {
			p := max(16, int(float64(in)*(1+0.27*rng.NormFloat64())))
			o := max(1, int(float64(out)+10*rng.NormFloat64()))
			return e.Submit(Request{PromptTokens: p, MaxTokens: o, IgnoreEOS: true})
		}
		var seqs []*Seq
		for range conc {
			s, err := submit()
			if err != nil {
				return 0, err
			}
			seqs = append(seqs, s)
		}
		for e.Busy() {
			r := e.Step()
			for range r.Finished {
				if len(seqs) < total {
					s, err := submit()
					if err != nil {
						return 0, err
					}
					seqs = append(seqs, s)
				}
			}
		}
		return f(summarise(seqs[conc:])), nil
	}
}

// offlineShareGPT submits n requests at once with ShareGPT-like lengths, as vLLM's
// benchmark_throughput does through the LLM class (offline batch defaults), and
// reduces the run with f.
func offlineShareGPT(n int, f func(runStats) float64) func(Config) (float64, error) {
	return func(cfg Config) (float64, error) {
		cfg.Offline = true
		e, err := New(cfg)
		if err != nil {
			return 0, err
		}
		rng := rand.New(rand.NewPCG(1, 2))
		seqs := make([]*Seq, 0, n)
		for _, l := range ShareGPTLike(rng, n) {
			s, err := e.Submit(Request{PromptTokens: l[0], OutputTokens: l[1], MaxTokens: l[1]})
			if err != nil {
				return 0, err
			}
			seqs = append(seqs, s)
		}
		for e.Busy() {
			e.Step()
		}
		return f(summarise(seqs)), nil
	}
}

// ShareGPTLike draws n (prompt, output) lengths shaped like the ShareGPT set vLLM's
// benchmarks use after their filters (prompt ≥ 4, prompt ≤ 1024, prompt + output ≤
// 2048): log-normal, means about 200 prompt and 180 output tokens.
func ShareGPTLike(rng *rand.Rand, n int) [][2]int {
	out := make([][2]int, 0, n)
	for len(out) < n {
		in := int(120 * math.Exp(1.0*rng.NormFloat64()))
		o := int(110 * math.Exp(1.0*rng.NormFloat64()))
		if in < 4 || o < 4 || in > 1024 || in+o > 2048 {
			continue
		}
		out = append(out, [2]int{in, o})
	}
	return out
}

func summarise(seqs []*Seq) runStats {
	var r runStats
	var ttft, itl time.Duration
	var itlN int
	first, last := seqs[0].Arrival, time.Duration(0)
	for _, s := range seqs {
		r.requests++
		r.outputs += s.Generated
		ttft += s.FirstToken - s.Arrival
		if s.Generated > 1 {
			itl += (s.Done - s.FirstToken) / time.Duration(s.Generated-1)
			itlN++
		}
		first = min(first, s.Arrival)
		last = max(last, s.Done)
	}
	r.meanTTFT = ttft / time.Duration(r.requests)
	if itlN > 0 {
		r.meanITL = itl / time.Duration(itlN)
	}
	r.makespan = last - first
	return r
}

// MeasureTTFT is the time to first token of one prompt of n tokens on an idle
// engine (batch 1, no cached prefix).
func MeasureTTFT(cfg Config, n int) (time.Duration, error) {
	e, err := New(cfg)
	if err != nil {
		return 0, err
	}
	s, err := e.Submit(Request{PromptTokens: n, MaxTokens: 1, IgnoreEOS: true})
	if err != nil {
		return 0, err
	}
	for s.Finish == "" {
		e.Step()
	}
	return s.FirstToken - s.Arrival, nil
}

// MeasureITL is the mean inter-token latency of batch requests of prompt/out
// tokens started together, prefill steps excluded.
func MeasureITL(cfg Config, batch, prompt, out int) (time.Duration, error) {
	e, err := New(cfg)
	if err != nil {
		return 0, err
	}
	for range batch {
		if _, err := e.Submit(Request{PromptTokens: prompt, MaxTokens: out, IgnoreEOS: true}); err != nil {
			return 0, err
		}
	}
	var sum time.Duration
	var n int
	for e.Busy() {
		r := e.Step()
		if r.Work.PrefillTokens == 0 && r.Work.DecodeSeqs > 0 {
			sum += r.End - r.Start
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("no decode steps")
	}
	return sum / time.Duration(n), nil
}

// Row is one line of the calibration table.
type Row struct {
	Reference
	Simulated float64
	Deviation float64 // (simulated − published) / published
}

// CalibrationTable measures every reference.
func CalibrationTable() ([]Row, error) {
	rows := make([]Row, 0, len(References))
	for _, ref := range References {
		v, err := ref.Measure(ref.Deployment.Config())
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", ref.Deployment, ref.Figure, err)
		}
		rows = append(rows, Row{Reference: ref, Simulated: v, Deviation: (v - ref.Published) / ref.Published})
	}
	return rows, nil
}

// ProfileRow is the simulator's standard figures for one deployment.
type ProfileRow struct {
	Deployment
	TTFT1k, TTFT4k time.Duration
	ITL1, ITL64    time.Duration
	KVBlocks       int
}

// ProfileDeployments are the deployments the profile table covers.
var ProfileDeployments = []Deployment{
	{"h100", "8b", 1}, {"a100", "8b", 1}, {"l40s", "8b", 1}, {"a10g", "8b", 1},
	{"h100", "32b", 1}, {"h100", "32b", 2}, {"a100", "32b", 2}, {"l40s", "32b", 2}, {"a10g", "32b", 4},
	{"h100", "70b", 4}, {"a100", "70b", 4}, {"l40s", "70b", 4}, {"a10g", "70b", 8},
}

// Profile measures TTFT of 1k- and 4k-token prompts at batch 1 and ITL at batch 1
// and 64 (1k in, 256 out) of a deployment.
func Profile(d Deployment) (ProfileRow, error) {
	cfg := d.Config()
	e, err := New(cfg)
	if err != nil {
		return ProfileRow{}, err
	}
	row := ProfileRow{Deployment: d, KVBlocks: e.NumBlocks()}
	if row.TTFT1k, err = MeasureTTFT(cfg, 1024); err != nil {
		return row, err
	}
	if row.TTFT4k, err = MeasureTTFT(cfg, 4096); err != nil {
		return row, err
	}
	if row.ITL1, err = MeasureITL(cfg, 1, 1024, 256); err != nil {
		return row, err
	}
	row.ITL64, err = MeasureITL(cfg, 64, 1024, 256)
	return row, err
}
