package sim

import (
	"fmt"
	"time"
)

// Calibration figures are measured on the engine itself, in virtual time, the way
// the published benchmarks measure a real server. docs/simulator.md compares them
// with published vLLM figures; `kvgate sim calibrate` prints them.

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

// MeasureITL is the mean inter-token latency of batch concurrent requests, each with
// a prompt of prompt tokens and out output tokens, started together; the prefill
// steps are excluded.
func MeasureITL(cfg Config, batch, prompt, out int) (time.Duration, error) {
	e, err := New(cfg)
	if err != nil {
		return 0, err
	}
	seqs := make([]*Seq, batch)
	for i := range seqs {
		// Distinct unhashed prompts: no prefix sharing between them.
		if seqs[i], err = e.Submit(Request{PromptTokens: prompt, MaxTokens: out, IgnoreEOS: true}); err != nil {
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

// MeasureThroughput is the output tokens per second of an offline run: requests
// prompts of prompt tokens and out output tokens, all submitted at once, as vLLM's
// benchmark_throughput does.
func MeasureThroughput(cfg Config, requests, prompt, out int) (float64, error) {
	e, err := New(cfg)
	if err != nil {
		return 0, err
	}
	for range requests {
		if _, err := e.Submit(Request{PromptTokens: prompt, MaxTokens: out, IgnoreEOS: true}); err != nil {
			return 0, err
		}
	}
	start := e.Now()
	for e.Busy() {
		e.Step()
	}
	return float64(requests*out) / (e.Now() - start).Seconds(), nil
}

// CalibrationRow is one deployment's measured figures.
type CalibrationRow struct {
	GPU, ModelSize    string
	TensorParallel    int
	TTFT1k, TTFT4k    time.Duration
	ITL1, ITL64       time.Duration
	PeakOutputPerSec  float64
	KVBlocks          int
	DecodeFloorPerTok time.Duration
}

// Calibrate measures a deployment with the standard shapes: TTFT at 1k and 4k
// prompts, ITL at batch 1 and 64 (1k in, 256 out), throughput of 1000 requests of
// 1k in / 256 out.
func Calibrate(gpu, size string, tp int) (CalibrationRow, error) {
	cfg := Config{GPU: gpu, ModelSize: size, TensorParallel: tp}
	e, err := New(cfg)
	if err != nil {
		return CalibrationRow{}, err
	}
	row := CalibrationRow{GPU: gpu, ModelSize: size, TensorParallel: tp, KVBlocks: e.NumBlocks(), DecodeFloorPerTok: e.CostModel().WeightRead}
	if row.TTFT1k, err = MeasureTTFT(cfg, 1024); err != nil {
		return row, err
	}
	if row.TTFT4k, err = MeasureTTFT(cfg, 4096); err != nil {
		return row, err
	}
	if row.ITL1, err = MeasureITL(cfg, 1, 1024, 256); err != nil {
		return row, err
	}
	if row.ITL64, err = MeasureITL(cfg, 64, 1024, 256); err != nil {
		return row, err
	}
	row.PeakOutputPerSec, err = MeasureThroughput(cfg, 1000, 1024, 256)
	return row, err
}

// Deployment names one GPU × model size × tensor-parallel combination.
type Deployment struct {
	GPU, ModelSize string
	TensorParallel int
}

// CalibrationDeployments are the deployments the calibration table covers.
var CalibrationDeployments = []Deployment{
	{"h100", "8b", 1}, {"a100", "8b", 1}, {"l40s", "8b", 1}, {"a10g", "8b", 1},
	{"h100", "32b", 1}, {"h100", "32b", 2}, {"a100", "32b", 2}, {"a10g", "32b", 4},
	{"h100", "70b", 4}, {"a100", "70b", 4}, {"l40s", "70b", 4}, {"a10g", "70b", 8},
}
