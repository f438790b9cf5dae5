package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Source is where a model server publishes one signal: the series of a metric
// whose labels match, read from their value or from one of their labels.
type Source struct {
	// Names are the metric's names, the current one first: the first the
	// exposition carries is read (vLLM renamed gpu_cache_usage_perc to
	// kv_cache_usage_perc). None: the server does not publish the signal.
	Names []string
	// Match keeps the series whose labels have these values; "" matches a
	// series without the label, as in PromQL.
	Match map[string]string
	// Scale multiplies what is read (0 means 1): 0.01 reads a percentage as a
	// share.
	Scale float64
	// Label reads the number from this label of the first matching series (an
	// info metric such as vllm:cache_config_info) rather than from its value.
	// Only BlockSize and NumBlocks read a label.
	Label string
}

// LoRASource is where a model server lists its LoRA adapters: labels of an info
// metric, read from the matching series of largest value (vLLM keeps one series
// per state it has been in, valued by the time it was set).
type LoRASource struct {
	Name    string
	Match   map[string]string
	Running string // label: the running adapters, comma-separated
	Waiting string // label: the waiting adapters, comma-separated (optional)
	Max     string // label: the most adapters loaded at once (optional)
}

// MapSpec is a metric map as written: where each signal is.
type MapSpec struct {
	Queue   Source // requests waiting: the sum of the matching series
	Running Source // requests running: the sum of the matching series
	// KVUsage is the share of the KV cache in use, 0..1 after Scale: the
	// largest of the matching series, the fullest engine deciding. When the
	// exposition lacks it, usage is KVUsed / KVTotal, each summed.
	KVUsage, KVUsed, KVTotal Source
	// BlockSize (tokens per KV block) and NumBlocks (KV blocks in all): the
	// largest matching value, or a label.
	BlockSize, NumBlocks Source
	LoRA                 LoRASource
	// LazyGauges: the server creates each gauge when it first sets it (TGI's
	// metrics crate), so a scrape carrying none of the map's load metrics is
	// a server yet to see a request, not an error; what it lacks is Missing.
	LazyGauges bool
}

// source is a Source ready to read: its matchers as a list.
type source struct {
	names []string
	match []labelPair
	scale float64
	label string
}

// Map reads an exposition's samples into Metrics. Built-in maps come from
// Builtin; a configured one from NewMap or Override. A Map is immutable and safe
// for concurrent use.
type Map struct {
	name                                                           Dialect
	spec                                                           MapSpec
	queue, running, kvUsage, kvUsed, kvTotal, blockSize, numBlocks source
	lora                                                           loraSource
	// want holds the families the map reads, each mapped to itself, so that a
	// sample can carry its name without allocating it; maxLen bounds the names
	// worth a lookup.
	want   map[string]string
	maxLen int
	// err fails every parse (Refusing).
	err error
}

// Refusing is a map that fails every scrape with err: for a configuration
// whose map could not be built, so that each endpoint says why.
func Refusing(err error) *Map { return &Map{name: Custom, err: err} }

type loraSource struct {
	name                     string
	match                    []labelPair
	running, waiting, maxKey string
}

// The forms of names the Prometheus text format allows.
var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// NewMap checks a map and readies it to read; name is the dialect Parse
// reports. It must read at least one of the queue, the running requests and
// the KV usage.
func NewMap(name Dialect, spec MapSpec) (*Map, error) {
	m := &Map{name: name, spec: spec, want: map[string]string{}}
	var errs []error
	src := func(what string, s Source, labelled bool) source {
		out := source{names: s.Names, scale: s.Scale, label: s.Label}
		if out.scale == 0 {
			out.scale = 1
		}
		if math.IsNaN(s.Scale) || math.IsInf(s.Scale, 0) || s.Scale < 0 {
			errs = append(errs, fmt.Errorf("%s: scale %v is not a positive number", what, s.Scale))
		}
		if s.Label != "" && !labelled {
			errs = append(errs, fmt.Errorf("%s: only blockSize and numBlocks read a label", what))
		}
		for _, l := range append([]string{s.Label}, slices.Sorted(maps.Keys(s.Match))...) {
			if l != "" && !labelName.MatchString(l) {
				errs = append(errs, fmt.Errorf("%s: %q is not a label name", what, l))
			}
		}
		if len(s.Names) == 0 && (len(s.Match) > 0 || s.Label != "" || s.Scale != 0) {
			errs = append(errs, fmt.Errorf("%s: labels, scale or label without a metric name", what))
		}
		for _, n := range s.Names {
			errs = append(errs, m.add(what, n))
		}
		out.match = matchers(s.Match)
		return out
	}
	m.queue = src("queue", spec.Queue, false)
	m.running = src("running", spec.Running, false)
	m.kvUsage = src("kvUsage", spec.KVUsage, false)
	m.kvUsed = src("kvUsed", spec.KVUsed, false)
	m.kvTotal = src("kvTotal", spec.KVTotal, false)
	m.blockSize = src("blockSize", spec.BlockSize, true)
	m.numBlocks = src("numBlocks", spec.NumBlocks, true)
	if (len(spec.KVUsed.Names) == 0) != (len(spec.KVTotal.Names) == 0) {
		errs = append(errs, errors.New("kvUsed and kvTotal go together: usage is kvUsed / kvTotal"))
	}
	if l := spec.LoRA; l.Name != "" || l.Running != "" || l.Waiting != "" || l.Max != "" || len(l.Match) > 0 {
		if l.Name == "" || l.Running == "" {
			errs = append(errs, errors.New("lora: needs the metric name and the label of the running adapters"))
		}
		for _, k := range append([]string{l.Running, l.Waiting, l.Max}, slices.Sorted(maps.Keys(l.Match))...) {
			if k != "" && !labelName.MatchString(k) {
				errs = append(errs, fmt.Errorf("lora: %q is not a label name", k))
			}
		}
		if l.Name != "" {
			errs = append(errs, m.add("lora", l.Name))
		}
		m.lora = loraSource{name: l.Name, match: matchers(l.Match), running: l.Running, waiting: l.Waiting, maxKey: l.Max}
	}
	if len(m.queue.names)+len(m.running.names)+len(m.kvUsage.names)+len(m.kvUsed.names) == 0 {
		errs = append(errs, errors.New("reads none of queue, running and kvUsage (or kvUsed with kvTotal)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s metric map: %w", name, err)
	}
	return m, nil
}

// add records a family the map reads.
func (m *Map) add(what, name string) error {
	if !metricName.MatchString(name) {
		return fmt.Errorf("%s: %q is not a metric name", what, name)
	}
	m.want[name] = name
	m.maxLen = max(m.maxLen, len(name))
	return nil
}

// matchers lists label matchers in name order.
func matchers(m map[string]string) []labelPair {
	out := make([]labelPair, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, labelPair{k, m[k]})
	}
	return out
}

// Override returns m with the signals spec sets in place of m's; the KV usage
// is replaced as a whole (kvUsage, kvUsed and kvTotal) when spec sets any of
// it. The result keeps m's name.
func (m *Map) Override(spec MapSpec) (*Map, error) {
	out := m.spec
	for _, f := range []struct{ dst, src *Source }{
		{&out.Queue, &spec.Queue}, {&out.Running, &spec.Running}, {&out.BlockSize, &spec.BlockSize}, {&out.NumBlocks, &spec.NumBlocks},
	} {
		if len(f.src.Names) > 0 {
			*f.dst = *f.src
		}
	}
	if len(spec.KVUsage.Names)+len(spec.KVUsed.Names)+len(spec.KVTotal.Names) > 0 {
		out.KVUsage, out.KVUsed, out.KVTotal = spec.KVUsage, spec.KVUsed, spec.KVTotal
	}
	if spec.LoRA.Name != "" {
		out.LoRA = spec.LoRA
	}
	return NewMap(m.name, out)
}

// Name is the dialect the map reads; "" for the nil map, which detects it.
func (m *Map) Name() Dialect {
	if m == nil {
		return ""
	}
	return m.name
}

// Spec is the map as written.
func (m *Map) Spec() MapSpec { return m.spec }

// Families lists the metric names the map reads, sorted.
func (m *Map) Families() []string { return slices.Sorted(maps.Keys(m.want)) }

// loadNames lists the metric names of the queue, running and KV usage, in
// that order: a scrape must carry one of them.
func (m *Map) loadNames() []string {
	var out []string
	for _, s := range []*source{&m.queue, &m.running, &m.kvUsage, &m.kvUsed, &m.kvTotal} {
		out = append(out, s.names...)
	}
	return out
}

// read takes the map's signals out of the samples of a scrape.
func (m *Map) read(x exposition) (Metrics, error) {
	var out Metrics
	var queue, run, kv bool
	out.Waiting, queue = m.queue.sum(x)
	out.Running, run = m.running.sum(x)
	if out.KVUsage, kv = m.kvUsage.max(x); !kv {
		used, okUsed := m.kvUsed.sum(x)
		total, okTotal := m.kvTotal.sum(x)
		if kv = okUsed && okTotal && total > 0; kv {
			out.KVUsage = used / total
		}
	}
	if !queue && !run && !kv && !m.spec.LazyGauges {
		return Metrics{}, fmt.Errorf("no %s metrics: the exposition carries none of %s", m.name, strings.Join(m.loadNames(), ", "))
	}
	out.BlockSize, out.NumBlocks = m.blockSize.integer(x), m.numBlocks.integer(x)
	m.lora.read(x, &out)
	for _, c := range []struct {
		present bool
		s       Signals
	}{{queue, SignalQueue}, {run, SignalRunning}, {kv, SignalKVUsage}, {out.BlockSize > 0 && out.NumBlocks > 0, SignalBlocks}, {out.HasLoRA, SignalLoRA}} {
		if !c.present {
			out.Missing |= c.s
		}
	}
	out.KVUsage = math.Min(math.Max(out.KVUsage, 0), 1)
	out.Waiting, out.Running = count(out.Waiting), count(out.Running)
	return out, nil
}

// series calls f with each sample of the first of s's names that has a matching
// series, and reports whether one did.
func (s *source) series(x exposition, f func(sample)) bool {
	for _, name := range s.names {
		found := false
		for _, smp := range x {
			if smp.family == name && smp.matches(s.match) {
				f(smp)
				found = true
			}
		}
		if found {
			return true
		}
	}
	return false
}

// sum adds the matching series: several engines behind one server add up.
// NaN and infinite values are skipped.
func (s *source) sum(x exposition) (float64, bool) {
	total, found := 0.0, false
	s.series(x, func(smp sample) {
		if finite(smp.value) {
			total, found = total+smp.value, true
		}
	})
	return total * s.scale, found
}

// max is the largest matching value: the fullest engine's KV cache decides.
func (s *source) max(x exposition) (float64, bool) {
	best, found := 0.0, false
	s.series(x, func(smp sample) {
		if finite(smp.value) && (!found || smp.value > best) {
			best, found = smp.value, true
		}
	})
	return best * s.scale, found
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// maxCount bounds a count a server reports (requests, blocks): past it, the
// number is the server's nonsense, and the picker's arithmetic on it would be.
const maxCount = 1 << 24

// count clamps a reported count to [0, maxCount].
func count(v float64) float64 { return math.Min(math.Max(v, 0), maxCount) }

// integer reads a count: the label of the first matching series, or the
// largest matching value; 0 when absent or not a number.
func (s *source) integer(x exposition) int {
	if s.label == "" {
		v, _ := s.max(x)
		return int(math.Round(count(v)))
	}
	v, done := 0.0, false
	s.series(x, func(smp sample) {
		if !done {
			v, _ = strconv.ParseFloat(smp.label(s.label), 64)
			done = true
		}
	})
	v *= s.scale
	if !finite(v) {
		return 0
	}
	return int(math.Round(count(v)))
}

// read takes the LoRA state from the matching series of largest value.
func (l *loraSource) read(x exposition, m *Metrics) {
	if l.name == "" {
		return
	}
	newest := -1
	for i, s := range x {
		if s.family == l.name && s.matches(l.match) && (newest < 0 || s.value > x[newest].value) {
			newest = i
		}
	}
	if newest < 0 {
		return
	}
	s := x[newest]
	m.HasLoRA = true
	if l.maxKey != "" {
		m.MaxLoRA, _ = strconv.Atoi(s.label(l.maxKey))
	}
	m.RunningAdapters = splitNames(s.label(l.running))
	if l.waiting != "" {
		m.WaitingAdapters = splitNames(s.label(l.waiting))
	}
}

func (s sample) matches(ms []labelPair) bool {
	for _, m := range ms {
		if s.label(m.name) != m.value {
			return false
		}
	}
	return true
}

func (s sample) label(key string) string {
	for _, l := range s.labels {
		if l.name == key {
			return l.value
		}
	}
	return ""
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

// maxAdapters bounds the adapter lists a server's metrics may name.
const maxAdapters = 1024

// Bounded is m with every value in the range a parse would give it: counts in
// [0, 2^24], KV usage in [0, 1], non-numbers 0, adapter lists capped. Metrics
// that did not come from a parse here (another replica's scrape) are read
// through it.
func (m Metrics) Bounded() Metrics {
	num := func(v float64) float64 {
		if !finite(v) {
			return 0
		}
		return count(v)
	}
	m.Waiting, m.Running = num(m.Waiting), num(m.Running)
	if !finite(m.KVUsage) {
		m.KVUsage = 0
	}
	m.KVUsage = math.Min(math.Max(m.KVUsage, 0), 1)
	m.BlockSize = int(count(float64(m.BlockSize)))
	m.NumBlocks = int(count(float64(m.NumBlocks)))
	m.MaxLoRA = int(count(float64(m.MaxLoRA)))
	if len(m.RunningAdapters) > maxAdapters {
		m.RunningAdapters = m.RunningAdapters[:maxAdapters]
	}
	if len(m.WaitingAdapters) > maxAdapters {
		m.WaitingAdapters = m.WaitingAdapters[:maxAdapters]
	}
	return m
}
