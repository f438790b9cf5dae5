// Package engine reads the Prometheus exposition of a model server into one
// Metrics value the picker scores on. A metric map (Map) says which series
// carry which signal: built-in maps read vLLM, SGLang, TensorRT-LLM
// (trtllm-serve), Triton's TensorRT-LLM backend, Hugging Face TGI and the
// llama.cpp server; a configured one reads any other server.
package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// Dialect is a model server's metric naming.
type Dialect string

// The dialects: the engines with a built-in map, and Custom, a map the
// configuration gives.
const (
	VLLM     Dialect = "vllm"
	SGLang   Dialect = "sglang"
	TRTLLM   Dialect = "trtllm"
	Triton   Dialect = "triton"
	TGI      Dialect = "tgi"
	LlamaCpp Dialect = "llamacpp"
	Custom   Dialect = "custom"
)

// Metrics is one scrape of a model server, in dialect-free terms.
type Metrics struct {
	Waiting float64 // requests queued
	Running float64 // requests in the running batch
	KVUsage float64 // share of KV-cache blocks in use, 0..1

	BlockSize int // tokens per KV block, 0 when not exported
	NumBlocks int // KV blocks in all, 0 when not exported

	// LoRA state: set when the server exports its map's LoRA info metric
	// (vLLM's lora_requests_info).
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

// sample is one series of a family a map reads.
type sample struct {
	family string
	labels []labelPair
	value  float64
}

type labelPair struct{ name, value string }

// exposition holds the samples of the families a map reads.
type exposition []sample

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Parse reads an exposition in the Prometheus text format with the built-in
// map of dialect; with dialect "" the dialect is detected from the families
// present. The dialect read is returned either way.
func Parse(r io.Reader, dialect Dialect) (Metrics, Dialect, error) {
	if dialect == "" {
		return (*Map)(nil).Parse(r)
	}
	m := Builtin(dialect)
	if m == nil {
		return Metrics{}, dialect, fmt.Errorf("unknown engine type %q (known: %s)", dialect, strings.Join(builtinNames(), ", "))
	}
	return m.Parse(r)
}

// Parse reads an exposition in the Prometheus text format with the map m; a nil
// m detects the built-in map from the families present. It returns the name of
// the map read with.
//
// A model server exports hundreds of series, mostly histograms, of which the
// picker needs a handful. Parse picks those lines out by name and reads only
// them: on the scrape loop (every 50 ms per endpoint) the Prometheus parser,
// which builds every family, cost 50 times more (BenchmarkParse against
// BenchmarkParsePrometheus on a 40 KB exposition) and kept a
// 256-endpoint fleet above its CPU budget (BenchmarkScrape256 in internal/fleet).
// The lines read are checked as strictly as the format requires; the rest is
// the model server's business.
func (m *Map) Parse(r io.Reader) (Metrics, Dialect, error) {
	if m != nil && m.err != nil {
		return Metrics{}, m.name, m.err
	}
	raw := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(raw)
	raw.Reset()
	if _, err := raw.ReadFrom(r); err != nil {
		return Metrics{}, m.Name(), fmt.Errorf("reading metrics: %w", err)
	}
	sc := m
	if m == nil {
		sc = detectAll
	}
	x, err := scan(raw.Bytes(), sc.want, sc.maxLen)
	if err != nil {
		return Metrics{}, m.Name(), fmt.Errorf("parsing metrics: %w", err)
	}
	if m == nil {
		if m = detect(x); m == nil {
			return Metrics{}, "", fmt.Errorf("no known model-server metrics (looked for %s)", strings.Join(detectAll.loadNames(), ", "))
		}
	}
	met, err := m.read(x)
	return met, m.name, err
}

// scan reads the sample lines of the wanted families; comments and other
// families are skipped unread.
func scan(src []byte, want map[string]string, maxLen int) (exposition, error) {
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
		// The name ends at '{' or a blank; one longer than any wanted is
		// passed over without reading it to its end.
		end, limit := 0, min(len(line), maxLen+1)
		for end < limit && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
			end++
		}
		if end > maxLen {
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
