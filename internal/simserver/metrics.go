package simserver

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/sim"
)

// Dialect is the metric naming of the engine a server imitates.
type Dialect string

// The dialects; their names and labels follow each engine's own exporter
// (vLLM's v1/metrics/loggers.py, SGLang's srt/metrics/collector.py, TensorRT-LLM's
// metrics/collector.py, Triton's TRT-LLM backend, TGI's router, llama.cpp's
// tools/server). DialectCustom is a server of no known engine, with names of
// its own (customNames), for kvgate's custom metric maps.
const (
	DialectVLLM     Dialect = "vllm"
	DialectSGLang   Dialect = "sglang"
	DialectTRTLLM   Dialect = "trtllm"
	DialectTriton   Dialect = "triton"
	DialectTGI      Dialect = "tgi"
	DialectLlamaCpp Dialect = "llamacpp"
	DialectCustom   Dialect = "custom"
)

// Dialects lists the supported dialects.
var Dialects = []Dialect{DialectVLLM, DialectSGLang, DialectTRTLLM, DialectTriton, DialectTGI, DialectLlamaCpp, DialectCustom}

// The custom dialect's series: requests by state in one family (pending,
// active, finished), the KV cache in blocks and as a percentage, and the block
// size as a label of an info metric.
const (
	CustomRequests     = "myserver_requests"         // {state="pending"|"active"|"finished"}
	CustomKVUsedBlocks = "myserver_kv_used_blocks"   // KV blocks in use
	CustomKVBlocks     = "myserver_kv_total_blocks"  // KV blocks in all
	CustomKVPercent    = "myserver_kv_usage_percent" // 0..100
	CustomCacheInfo    = "myserver_cache_info"       // {block_size="16"} 1
)

// SimScrapes counts the /metrics requests a server has answered, in every
// dialect: not an engine's series but the simulator's.
const SimScrapes = "kvgate_sim_scrapes_total"

// vLLM's histogram buckets (seconds).
var (
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	vllmE2EBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	sglangBuckets   = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
)

// maxLoRAInfoSeries bounds the lora_requests_info history: vLLM keeps one series per
// label combination ever seen; consumers must take the newest.
const maxLoRAInfoSeries = 8

// metrics exports a server's engine state in its dialect.
type metrics struct {
	s       *Server
	dialect Dialect
	model   string
	ttft    prometheus.Histogram
	e2e     prometheus.Histogram
	itl     prometheus.Histogram

	mu       sync.Mutex
	loraInfo map[[3]string]float64 // (max, running, waiting) → last timestamp
	// used: a request has arrived. TGI's gauges and counters exist only from
	// their first update.
	used bool
}

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s, dialect: s.opts.Dialect, model: s.opts.ServedName, loraInfo: map[[3]string]float64{}}
	labels := m.baseLabels()
	hist := func(name string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: name, Buckets: buckets, ConstLabels: labels})
	}
	switch m.dialect {
	case DialectVLLM:
		m.ttft = hist("vllm:time_to_first_token_seconds", vllmTTFTBuckets)
		m.e2e = hist("vllm:e2e_request_latency_seconds", vllmE2EBuckets)
		m.itl = hist("vllm:inter_token_latency_seconds", []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80})
	case DialectSGLang:
		m.ttft = hist("sglang:time_to_first_token_seconds", sglangBuckets)
		m.e2e = hist("sglang:e2e_request_latency_seconds", sglangBuckets)
	case DialectTRTLLM:
		m.ttft = hist("trtllm_time_to_first_token_seconds", vllmTTFTBuckets)
		m.e2e = hist("trtllm_e2e_request_latency_seconds", vllmE2EBuckets)
	case DialectTGI:
		m.e2e = hist("tgi_request_duration", vllmE2EBuckets)
	}
	return m
}

func (m *metrics) baseLabels() prometheus.Labels {
	switch m.dialect {
	case DialectVLLM:
		return prometheus.Labels{"model_name": m.model, "engine": "0"}
	case DialectTRTLLM:
		return prometheus.Labels{"model_name": m.model, "engine_type": "trtllm"}
	case DialectTriton:
		return prometheus.Labels{"model": m.model, "version": "1"}
	case DialectTGI, DialectLlamaCpp:
		return nil // their series carry no labels
	case DialectCustom:
		return prometheus.Labels{"model": m.model}
	default:
		return prometheus.Labels{"model_name": m.model}
	}
}

// observeFirstToken and observeFinished are called by the driver, under s.mu.
func (m *metrics) observeFirstToken(q *sim.Seq) {
	if m.ttft != nil {
		m.ttft.Observe((q.FirstToken - q.Arrival).Seconds())
	}
}

func (m *metrics) observeFinished(q *sim.Seq) {
	if m.e2e != nil {
		m.e2e.Observe((q.Done - q.Arrival).Seconds())
	}
}

// observeTokenGap records the time between two tokens of a sequence, once per
// token as vLLM does, so that stalls show in the buckets.
func (m *metrics) observeTokenGap(d time.Duration) {
	if m.itl != nil {
		m.itl.Observe(d.Seconds())
	}
}

// Describe sends nothing: the set of series depends on engine state (LoRA history),
// which makes this an unchecked collector.
func (m *metrics) Describe(chan<- *prometheus.Desc) {}

// Collect reads the engine under the server lock and emits the dialect's series.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.s.mu.Lock()
	snap := m.s.eng.Snapshot()
	cfg := m.s.eng.Config()
	m.s.mu.Unlock()
	e := emitter{ch: ch, base: m.baseLabels(), omit: m.s.opts.OmitMetrics}
	st := snap.Stats
	// The simulator's own series, in every dialect: the /metrics requests served,
	// this one included (the load scrapers put on the server).
	e.raw(prometheus.CounterValue, SimScrapes, float64(m.s.Scrapes()), nil)
	switch m.dialect {
	case DialectVLLM:
		e.gauge("vllm:num_requests_running", float64(snap.Running))
		e.gauge("vllm:num_requests_waiting", float64(snap.Waiting))
		if m.s.opts.LegacyNames {
			e.gauge("vllm:gpu_cache_usage_perc", snap.KVUsage)
		} else {
			e.gauge("vllm:kv_cache_usage_perc", snap.KVUsage)
		}
		e.counter("vllm:prefix_cache_queries_total", float64(st.PrefixQueries))
		e.counter("vllm:prefix_cache_hits_total", float64(st.PrefixHits))
		e.counter("vllm:prompt_tokens_total", float64(st.PromptTokens))
		e.counter("vllm:generation_tokens_total", float64(st.GenerationTokens))
		e.counter("vllm:num_preemptions_total", float64(st.Preemptions))
		for _, r := range []sim.FinishReason{sim.FinishStop, sim.FinishLength, sim.FinishAbort} {
			e.counter("vllm:request_success_total", float64(st.FinishedByReason[r]), "finished_reason", string(r))
		}
		e.raw(prometheus.GaugeValue, "vllm:cache_config_info", 1, prometheus.Labels{
			"engine": "0", "block_size": strconv.Itoa(snap.BlockSize), "num_gpu_blocks": strconv.Itoa(snap.NumBlocks),
			"num_cpu_blocks": "None", "cache_dtype": "auto", "enable_prefix_caching": strconv.FormatBool(!cfg.DisablePrefixCaching),
			"gpu_memory_utilization": strconv.FormatFloat(cfg.GPUMemoryUtilization, 'g', -1, 64),
		})
		if m.s.loraEnabled() {
			m.emitLoRAInfo(e, snap)
		}
	case DialectSGLang:
		e.gauge("sglang:num_running_reqs", float64(snap.Running))
		e.gauge("sglang:num_queue_reqs", float64(snap.Waiting))
		e.gauge("sglang:token_usage", snap.KVUsage)
		e.gauge("sglang:max_total_num_tokens", float64(snap.NumBlocks*snap.BlockSize))
		e.gauge("sglang:num_used_tokens", float64(int(snap.KVUsage*float64(snap.NumBlocks))*snap.BlockSize))
		hit := 0.0
		if st.PrefixQueries > 0 {
			hit = float64(st.PrefixHits) / float64(st.PrefixQueries)
		}
		e.gauge("sglang:cache_hit_rate", hit)
		e.counter("sglang:prompt_tokens_total", float64(st.PromptTokens))
		e.counter("sglang:generation_tokens_total", float64(st.GenerationTokens))
		e.raw(prometheus.GaugeValue, "sglang:cache_config_info", 1, prometheus.Labels{
			"page_size": strconv.Itoa(snap.BlockSize), "num_pages": strconv.Itoa(snap.NumBlocks),
		})
	case DialectTRTLLM:
		e.gauge("trtllm_num_requests_running", float64(snap.Running))
		e.gauge("trtllm_num_requests_waiting", float64(snap.Waiting))
		e.gauge("trtllm_kv_cache_utilization", snap.KVUsage)
		e.gauge("trtllm_kv_cache_tokens_per_block", float64(snap.BlockSize))
		e.gauge("trtllm_kv_cache_max_blocks", float64(snap.NumBlocks))
		e.counter("trtllm_prompt_tokens_total", float64(st.PromptTokens))
		e.counter("trtllm_generation_tokens_total", float64(st.GenerationTokens))
		for _, r := range []sim.FinishReason{sim.FinishStop, sim.FinishLength, sim.FinishAbort} {
			e.counter("trtllm_request_success_total", float64(st.FinishedByReason[r]), "finished_reason", string(r))
		}
	case DialectTriton:
		for typ, v := range map[string]float64{
			"active": float64(snap.Running + snap.Waiting), "max": float64(cfg.MaxNumSeqs),
			"scheduled": float64(snap.Running), "context": 0, "waiting": float64(snap.Waiting),
		} {
			e.gauge("nv_trt_llm_request_metrics", v, "request_type", typ)
		}
		used := float64(int(snap.KVUsage*float64(snap.NumBlocks) + 0.5))
		for typ, v := range map[string]float64{
			"max": float64(snap.NumBlocks), "free": float64(snap.NumBlocks) - used, "used": used,
			"tokens_per": float64(snap.BlockSize), "fraction": snap.KVUsage,
		} {
			e.gauge("nv_trt_llm_kv_cache_block_metrics", v, "kv_cache_block_type", typ)
		}
		e.counter("nv_inference_request_success", float64(finished(st)))
	case DialectTGI:
		if !m.usedYet(snap) {
			return // a fresh TGI router exports none of its series
		}
		e.gauge("tgi_queue_size", float64(snap.Waiting))
		e.gauge("tgi_batch_current_size", float64(snap.Running))
		e.gauge("tgi_batch_current_max_tokens", float64(int(snap.KVUsage*float64(snap.NumBlocks))*snap.BlockSize))
		e.counter("tgi_request_count", float64(snap.Running+snap.Waiting)+float64(finished(st)))
		e.counter("tgi_request_success", float64(st.FinishedByReason[sim.FinishStop]+st.FinishedByReason[sim.FinishLength]))
	case DialectLlamaCpp:
		e.counter("llamacpp:prompt_tokens_total", float64(st.PromptTokens))
		e.counter("llamacpp:tokens_predicted_total", float64(st.GenerationTokens))
		e.counter("llamacpp:n_decode_total", float64(st.Steps))
		e.gauge("llamacpp:requests_processing", float64(snap.Running))
		e.gauge("llamacpp:requests_deferred", float64(snap.Waiting))
		if m.s.opts.LegacyNames { // llama.cpp builds before the KV gauges were dropped
			used := int(snap.KVUsage * float64(snap.NumBlocks))
			e.gauge("llamacpp:kv_cache_usage_ratio", snap.KVUsage)
			e.gauge("llamacpp:kv_cache_tokens", float64(used*snap.BlockSize))
		}
	case DialectCustom:
		used := float64(int(snap.KVUsage*float64(snap.NumBlocks) + 0.5))
		e.gauge(CustomRequests, float64(snap.Waiting), "state", "pending")
		e.gauge(CustomRequests, float64(snap.Running), "state", "active")
		e.gauge(CustomRequests, float64(finished(st)), "state", "finished")
		e.gauge(CustomKVUsedBlocks, used)
		e.gauge(CustomKVBlocks, float64(snap.NumBlocks))
		e.gauge(CustomKVPercent, 100*snap.KVUsage)
		e.gauge(CustomCacheInfo, 1, "block_size", strconv.Itoa(snap.BlockSize))
	}
	for _, h := range []prometheus.Histogram{m.ttft, m.e2e, m.itl} {
		if h != nil {
			h.Collect(ch)
		}
	}
}

// finished counts the requests the engine has finished.
func finished(st sim.Stats) int64 {
	var n int64
	for _, v := range st.FinishedByReason {
		n += v
	}
	return n
}

// usedYet reports whether a request has arrived, as of snap or before.
func (m *metrics) usedYet(snap sim.Snapshot) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = m.used || snap.Waiting+snap.Running > 0 || snap.Stats.Steps > 0
	return m.used
}

// emitLoRAInfo keeps vLLM's habit of one series per adapter state, valued with the
// time the state was last seen, so consumers must pick the newest series.
func (m *metrics) emitLoRAInfo(e emitter, snap sim.Snapshot) {
	key := [3]string{strconv.Itoa(snap.MaxLoRAs), strings.Join(snap.RunningAdapters, ","), strings.Join(snap.WaitingAdapters, ",")}
	now := float64(time.Now().UnixNano()) / 1e9
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loraInfo[key] = now
	if len(m.loraInfo) > maxLoRAInfoSeries {
		var oldest [3]string
		first := true
		for k, ts := range m.loraInfo {
			if first || ts < m.loraInfo[oldest] {
				oldest, first = k, false
			}
		}
		delete(m.loraInfo, oldest)
	}
	for k, ts := range m.loraInfo {
		e.raw(prometheus.GaugeValue, "vllm:lora_requests_info", ts, prometheus.Labels{
			"max_lora": k[0], "running_lora_adapters": k[1], "waiting_lora_adapters": k[2],
		})
	}
}

// emitter builds constant metrics with the dialect's base labels.
type emitter struct {
	ch   chan<- prometheus.Metric
	base prometheus.Labels
	omit []string // families not exported
}

func (e emitter) gauge(name string, v float64, kv ...string) {
	e.withBase(prometheus.GaugeValue, name, v, kv...)
}

func (e emitter) counter(name string, v float64, kv ...string) {
	e.withBase(prometheus.CounterValue, name, v, kv...)
}

func (e emitter) withBase(t prometheus.ValueType, name string, v float64, kv ...string) {
	labels := make(prometheus.Labels, len(e.base)+len(kv)/2)
	for k, val := range e.base {
		labels[k] = val
	}
	for i := 0; i+1 < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	e.raw(t, name, v, labels)
}

func (e emitter) raw(t prometheus.ValueType, name string, v float64, labels prometheus.Labels) {
	if slices.Contains(e.omit, name) {
		return
	}
	e.ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, name, nil, labels), t, v)
}
