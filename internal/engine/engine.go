// Package engine reads the Prometheus exposition of a model server — vLLM, SGLang,
// TensorRT-LLM (trtllm-serve) or Triton's TensorRT-LLM backend — into one Metrics
// value the picker scores on.
package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
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

	// Missing lists the signals the scrape did not carry: their fields above
	// read 0, which says nothing of the server. The zero value is a scrape
	// that carried every signal (the benchmark's engines, tests).
	Missing Signals
}

// Signals is a set of the signals a model server may publish.
type Signals uint8

// The signals a scorer or filter may read.
const (
	SignalQueue   Signals = 1 << iota // Waiting
	SignalRunning                     // Running
	SignalKVUsage                     // KVUsage
	SignalBlocks                      // BlockSize and NumBlocks
	SignalLoRA                        // HasLoRA and the adapter lists
)

// signalNames name the signals in bit order, for /debug/fleet and the docs.
var signalNames = [...]string{"queue", "running", "kvUsage", "kvBlocks", "lora"}

// AllSignals is every signal.
const AllSignals = SignalQueue | SignalRunning | SignalKVUsage | SignalBlocks | SignalLoRA

// Has reports whether every signal of o is in s.
func (s Signals) Has(o Signals) bool { return s&o == o }

// Names lists the signals of s by name, in bit order.
func (s Signals) Names() []string {
	out := []string{}
	for i, n := range signalNames {
		if s&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// Published is the set of signals the scrape carried.
func (m Metrics) Published() Signals { return AllSignals &^ m.Missing }

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

// families lists, per dialect, the metric families Parse reads.
var families = map[Dialect][]string{
	VLLM: {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
		"vllm:cache_config_info", "vllm:lora_requests_info"},
	SGLang: {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info"},
	TRTLLM: {"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization",
		"trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_max_blocks"},
	Triton: {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"},
}

// wanted holds the families as sets, per dialect; under "" the union of all, for
// detection. A set maps a name to itself, so that a sample can carry the name
// without allocating it.
var wanted = func() map[Dialect]map[string]string {
	out := map[Dialect]map[string]string{"": {}}
	for d, fs := range families {
		out[d] = map[string]string{}
		for _, f := range fs {
			out[d][f] = f
			out[""][f] = f
		}
	}
	return out
}()

// maxFamilyLen bounds the names worth a map lookup.
var maxFamilyLen = func() int {
	n := 0
	for f := range wanted[""] {
		n = max(n, len(f))
	}
	return n
}()

// sample is one series of a family Parse reads.
type sample struct {
	family string
	labels []labelPair
	value  float64
}

type labelPair struct{ name, value string }

// exposition holds the samples of the families a dialect reads.
type exposition []sample

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Parse reads an exposition in the Prometheus text format. With dialect "" the
// dialect is detected from the families present; it is returned either way.
//
// A model server exports hundreds of series, mostly histograms, of which the
// picker needs a handful. Parse picks those lines out by name and reads only
// them: on the scrape loop (every 50 ms per endpoint) the Prometheus parser,
// which builds every family, cost 50 times more (BenchmarkParse against
// BenchmarkParsePrometheus on a 40 KB exposition) and kept a
// 256-endpoint fleet above its CPU budget (BenchmarkScrape256 in internal/fleet).
// The lines read are checked as strictly as the format requires; the rest is
// the model server's business.
func Parse(r io.Reader, dialect Dialect) (Metrics, Dialect, error) {
	raw := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(raw)
	raw.Reset()
	if _, err := raw.ReadFrom(r); err != nil {
		return Metrics{}, dialect, fmt.Errorf("reading metrics: %w", err)
	}
	want, ok := wanted[dialect]
	if !ok {
		want = wanted[""]
	}
	fams, err := scan(raw.Bytes(), want)
	if err != nil {
		return Metrics{}, dialect, fmt.Errorf("parsing metrics: %w", err)
	}
	if dialect == "" {
		for _, d := range detect {
			if fams.has(d.family) {
				dialect = d.dialect
				break
			}
		}
		if dialect == "" {
			return Metrics{}, "", fmt.Errorf("no known model-server metrics (looked for %s)", knownFamilies())
		}
	}
	var m Metrics
	var run, kv, blocks bool
	switch dialect {
	case VLLM:
		m.Waiting, ok = fams.sum("vllm:num_requests_waiting", "", "")
		m.Running, run = fams.sum("vllm:num_requests_running", "", "")
		if m.KVUsage, kv = fams.max("vllm:kv_cache_usage_perc"); !kv {
			m.KVUsage, kv = fams.max("vllm:gpu_cache_usage_perc") // before vLLM 0.10
		}
		m.BlockSize, m.NumBlocks = fams.labelInts("vllm:cache_config_info", "block_size", "num_gpu_blocks")
		fams.readLoRA(&m)
	case SGLang:
		m.Waiting, ok = fams.sum("sglang:num_queue_reqs", "", "")
		m.Running, run = fams.sum("sglang:num_running_reqs", "", "")
		m.KVUsage, kv = fams.max("sglang:token_usage")
		m.BlockSize, m.NumBlocks = fams.labelInts("sglang:cache_config_info", "page_size", "num_pages")
	case TRTLLM:
		m.Waiting, ok = fams.sum("trtllm_num_requests_waiting", "", "")
		m.Running, run = fams.sum("trtllm_num_requests_running", "", "")
		m.KVUsage, kv = fams.max("trtllm_kv_cache_utilization")
		bs, _ := fams.max("trtllm_kv_cache_tokens_per_block")
		nb, _ := fams.max("trtllm_kv_cache_max_blocks")
		m.BlockSize, m.NumBlocks = int(bs), int(nb)
	case Triton:
		const f, kvf = "nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"
		m.Waiting, ok = fams.sum(f, "request_type", "waiting")
		m.Running, run = fams.sum(f, "request_type", "scheduled")
		m.KVUsage, kv = fams.sum(kvf, "kv_cache_block_type", "fraction")
		bs, _ := fams.sum(kvf, "kv_cache_block_type", "tokens_per")
		nb, _ := fams.sum(kvf, "kv_cache_block_type", "max")
		m.BlockSize, m.NumBlocks = int(bs), int(nb)
	default:
		return Metrics{}, dialect, fmt.Errorf("unknown engine type %q", dialect)
	}
	if !ok {
		return Metrics{}, dialect, fmt.Errorf("the %s metrics lack the queue length", dialect)
	}
	blocks = m.BlockSize > 0 && m.NumBlocks > 0
	for _, c := range []struct {
		present bool
		s       Signals
	}{{run, SignalRunning}, {kv, SignalKVUsage}, {blocks, SignalBlocks}, {m.HasLoRA, SignalLoRA}} {
		if !c.present {
			m.Missing |= c.s
		}
	}
	m.KVUsage = math.Min(math.Max(m.KVUsage, 0), 1)
	return m, dialect, nil
}

// scan reads the sample lines of the wanted families; comments and other
// families are skipped unread.
func scan(src []byte, want map[string]string) (exposition, error) {
	var out exposition
	for n := 1; len(src) > 0; n++ {
		line := src
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i], src[i+1:]
		} else {
			src = nil
		}
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := 0
		for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
			end++
		}
		if end > maxFamilyLen {
			continue
		}
		fam, ok := want[string(line[:end])]
		if !ok {
			continue
		}
		smp, err := parseSample(fam, line[end:])
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, fam, err)
		}
		out = append(out, smp)
	}
	return out, nil
}

// parseSample reads `{name="value",...} value [timestamp]` after a metric name.
func parseSample(fam string, rest []byte) (sample, error) {
	smp := sample{family: fam}
	if len(rest) > 0 && rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = bytes.TrimLeft(rest, " \t")
			if len(rest) > 0 && rest[0] == '}' {
				rest = rest[1:]
				break
			}
			eq := bytes.IndexByte(rest, '=')
			if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
				return smp, errors.New("malformed label")
			}
			name := string(bytes.TrimSpace(rest[:eq]))
			val, n, err := unquote(rest[eq+1:])
			if err != nil {
				return smp, err
			}
			smp.labels = append(smp.labels, labelPair{name, val})
			rest = bytes.TrimLeft(rest[eq+1+n:], " \t")
			if len(rest) > 0 && rest[0] == ',' {
				rest = rest[1:]
			}
		}
	}
	f := bytes.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return smp, errors.New("expected a value and an optional timestamp")
	}
	v, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil {
		return smp, fmt.Errorf("value %q: %w", f[0], err)
	}
	smp.value = v
	return smp, nil
}

// unquote reads a quoted label value with the format's escapes (\\, \", \n) and
// returns it with the bytes consumed.
func unquote(b []byte) (string, int, error) {
	var sb []byte
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '"':
			if sb == nil {
				return string(b[1:i]), i + 1, nil
			}
			return string(sb), i + 1, nil
		case '\\':
			if sb == nil {
				sb = append([]byte{}, b[1:i]...)
			}
			i++
			if i == len(b) {
				return "", 0, errors.New("unterminated label value")
			}
			switch b[i] {
			case 'n':
				sb = append(sb, '\n')
			case '\\', '"':
				sb = append(sb, b[i])
			default:
				return "", 0, fmt.Errorf("invalid escape \\%c in label value", b[i])
			}
		default:
			if sb != nil {
				sb = append(sb, b[i])
			}
		}
	}
	return "", 0, errors.New("unterminated label value")
}

func (x exposition) has(fam string) bool {
	return slices.ContainsFunc(x, func(s sample) bool { return s.family == fam })
}

// sum adds the series of a family whose label key has value v (every series when
// key is empty): several engines behind one server add up.
func (x exposition) sum(fam, key, v string) (float64, bool) {
	total, found := 0.0, false
	for _, s := range x {
		if s.family != fam || key != "" && s.label(key) != v || math.IsNaN(s.value) {
			continue
		}
		total += s.value
		found = true
	}
	return total, found
}

// max is the largest value of a family: the fullest engine's KV cache decides.
func (x exposition) max(fam string) (float64, bool) {
	best, found := 0.0, false
	for _, s := range x {
		if s.family == fam && !math.IsNaN(s.value) && (!found || s.value > best) {
			best, found = s.value, true
		}
	}
	return best, found
}

func (s sample) label(key string) string {
	for _, l := range s.labels {
		if l.name == key {
			return l.value
		}
	}
	return ""
}

// labelInts reads two integer labels of the first series of an info family.
func (x exposition) labelInts(fam, a, b string) (int, int) {
	i := slices.IndexFunc(x, func(s sample) bool { return s.family == fam })
	if i < 0 {
		return 0, 0
	}
	p, _ := strconv.Atoi(x[i].label(a))
	q, _ := strconv.Atoi(x[i].label(b))
	return p, q
}

// readLoRA reads the newest lora_requests_info series: vLLM keeps one series per
// state it has been in, valued by the time it was set.
func (x exposition) readLoRA(m *Metrics) {
	newest := -1
	for i, s := range x {
		if s.family == "vllm:lora_requests_info" && (newest < 0 || s.value > x[newest].value) {
			newest = i
		}
	}
	if newest < 0 {
		return
	}
	s := x[newest]
	m.HasLoRA = true
	m.MaxLoRA, _ = strconv.Atoi(s.label("max_lora"))
	m.RunningAdapters = splitNames(s.label("running_lora_adapters"))
	m.WaitingAdapters = splitNames(s.label("waiting_lora_adapters"))
}

func knownFamilies() string {
	names := make([]string, len(detect))
	for i, d := range detect {
		names[i] = d.family
	}
	return strings.Join(names, ", ")
}

// readLoRA takes vLLM's lora_requests_info series with the newest timestamp value:
// older states linger as series of their own.

func splitNames(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
