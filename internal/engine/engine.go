// Package engine reads the Prometheus exposition of a model server — vLLM, SGLang,
// TensorRT-LLM (trtllm-serve) or Triton's TensorRT-LLM backend — into one Metrics
// value the picker scores on.
package engine

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Dialect is a model server's metric naming.
type Dialect string

// The dialects, with the names they are detected by.
const (
	VLLM   Dialect = "vllm"
	SGLang Dialect = "sglang"
	TRTLLM Dialect = "trtllm"
	Triton Dialect = "triton"
)

// Metrics is one scrape of a model server, in dialect-free terms.
type Metrics struct {
	Waiting float64 // requests queued
	Running float64 // requests in the running batch
	KVUsage float64 // share of KV-cache blocks in use, 0..1

	BlockSize int // tokens per KV block, 0 when not exported
	NumBlocks int // KV blocks in all, 0 when not exported

	// LoRA state (vLLM): set when the server exports lora_requests_info.
	HasLoRA         bool
	MaxLoRA         int
	RunningAdapters []string
	WaitingAdapters []string
}

// detect lists, per dialect, the family whose presence identifies it.
var detect = []struct {
	family  string
	dialect Dialect
}{
	{"vllm:num_requests_waiting", VLLM},
	{"sglang:num_queue_reqs", SGLang},
	{"trtllm_num_requests_waiting", TRTLLM},
	{"nv_trt_llm_request_metrics", Triton},
}

// Parse reads an exposition in the text format. With dialect "" the dialect is
// detected from the families present; it is returned either way.
func Parse(r io.Reader, dialect Dialect) (Metrics, Dialect, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, dialect, fmt.Errorf("parsing metrics: %w", err)
	}
	if dialect == "" {
		for _, d := range detect {
			if _, ok := fams[d.family]; ok {
				dialect = d.dialect
				break
			}
		}
		if dialect == "" {
			return Metrics{}, "", fmt.Errorf("no known model-server metrics (looked for %s)", knownFamilies())
		}
	}
	var m Metrics
	var ok bool
	switch dialect {
	case VLLM:
		m.Waiting, ok = sum(fams, "vllm:num_requests_waiting")
		m.Running, _ = sum(fams, "vllm:num_requests_running")
		var kv bool
		if m.KVUsage, kv = maxOf(fams, "vllm:kv_cache_usage_perc"); !kv {
			m.KVUsage, _ = maxOf(fams, "vllm:gpu_cache_usage_perc") // before vLLM 0.10
		}
		m.BlockSize, m.NumBlocks = labelInts(fams, "vllm:cache_config_info", "block_size", "num_gpu_blocks")
		readLoRA(fams, &m)
	case SGLang:
		m.Waiting, ok = sum(fams, "sglang:num_queue_reqs")
		m.Running, _ = sum(fams, "sglang:num_running_reqs")
		m.KVUsage, _ = maxOf(fams, "sglang:token_usage")
		m.BlockSize, m.NumBlocks = labelInts(fams, "sglang:cache_config_info", "page_size", "num_pages")
	case TRTLLM:
		m.Waiting, ok = sum(fams, "trtllm_num_requests_waiting")
		m.Running, _ = sum(fams, "trtllm_num_requests_running")
		m.KVUsage, _ = maxOf(fams, "trtllm_kv_cache_utilization")
		bs, _ := maxOf(fams, "trtllm_kv_cache_tokens_per_block")
		nb, _ := maxOf(fams, "trtllm_kv_cache_max_blocks")
		m.BlockSize, m.NumBlocks = int(bs), int(nb)
	case Triton:
		f := fams["nv_trt_llm_request_metrics"]
		m.Waiting, ok = sumWhere(f, "request_type", "waiting")
		m.Running, _ = sumWhere(f, "request_type", "scheduled")
		kv := fams["nv_trt_llm_kv_cache_block_metrics"]
		m.KVUsage, _ = sumWhere(kv, "kv_cache_block_type", "fraction")
		bs, _ := sumWhere(kv, "kv_cache_block_type", "tokens_per")
		nb, _ := sumWhere(kv, "kv_cache_block_type", "max")
		m.BlockSize, m.NumBlocks = int(bs), int(nb)
	default:
		return Metrics{}, dialect, fmt.Errorf("unknown engine type %q", dialect)
	}
	if !ok {
		return Metrics{}, dialect, fmt.Errorf("the %s metrics lack the queue length", dialect)
	}
	m.KVUsage = math.Min(math.Max(m.KVUsage, 0), 1)
	return m, dialect, nil
}

func knownFamilies() string {
	names := make([]string, len(detect))
	for i, d := range detect {
		names[i] = d.family
	}
	return strings.Join(names, ", ")
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// sum adds every series of a family (several engines behind one server add up).
func sum(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	return sumWhere(f, "", "")
}

// sumWhere adds the series of f whose label key has value v (every series when key
// is empty).
func sumWhere(f *dto.MetricFamily, key, v string) (float64, bool) {
	if f == nil {
		return 0, false
	}
	total, found := 0.0, false
	for _, m := range f.GetMetric() {
		if key != "" && label(m, key) != v {
			continue
		}
		if x := value(m); !math.IsNaN(x) {
			total += x
			found = true
		}
	}
	return total, found
}

// maxOf is the largest value of a family: the fullest engine's KV cache decides.
func maxOf(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	best, found := 0.0, false
	for _, m := range f.GetMetric() {
		if x := value(m); !math.IsNaN(x) && (!found || x > best) {
			best, found = x, true
		}
	}
	return best, found
}

func label(m *dto.Metric, key string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == key {
			return l.GetValue()
		}
	}
	return ""
}

// labelInts reads two integer labels of the first series of an info family.
func labelInts(fams map[string]*dto.MetricFamily, name string, a, b string) (int, int) {
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		return 0, 0
	}
	m := f.GetMetric()[0]
	x, _ := strconv.Atoi(label(m, a))
	y, _ := strconv.Atoi(label(m, b))
	return x, y
}

// readLoRA takes vLLM's lora_requests_info series with the newest timestamp value:
// older states linger as series of their own.
func readLoRA(fams map[string]*dto.MetricFamily, m *Metrics) {
	f, ok := fams["vllm:lora_requests_info"]
	if !ok {
		return
	}
	var newest *dto.Metric
	for _, s := range f.GetMetric() {
		if newest == nil || value(s) > value(newest) {
			newest = s
		}
	}
	if newest == nil {
		return
	}
	m.HasLoRA = true
	m.MaxLoRA, _ = strconv.Atoi(label(newest, "max_lora"))
	m.RunningAdapters = splitNames(label(newest, "running_lora_adapters"))
	m.WaitingAdapters = splitNames(label(newest, "waiting_lora_adapters"))
}

func splitNames(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
