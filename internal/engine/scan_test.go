package engine

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// TestScanMatchesPrometheus writes random families with the Prometheus encoder —
// odd label values, escapes, special floats, timestamps, other families around
// them — and checks that the hand-written scan reads back exactly what the
// encoder wrote for the families it wants.
func TestScanMatchesPrometheus(t *testing.T) {
	vllm := Builtin(VLLM)
	rng := rand.New(rand.NewPCG(7, 8))
	odd := []string{"", "plain", `quo"te`, `back\slash`, "new\nline", "ünïcödé", "a,b,c", "{}=", " spaced "}
	values := []float64{0, 1, -2.5, 1e-9, 3.4e38, math.Inf(1), math.Inf(-1)}
	for round := range 300 {
		var want []sample
		var text bytes.Buffer
		names := []string{"vllm:num_requests_waiting", "vllm:lora_requests_info", "vllm:e2e_request_latency_seconds", "vllm:cache_config_info", "process_cpu_seconds_total"}
		for _, name := range names {
			fam := &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_GAUGE.Enum(), Help: proto.String("help with \\ and \n")}
			for range rng.IntN(3) {
				m := &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(values[rng.IntN(len(values))])}}
				labels := []string{"a", "model_name", "running_lora_adapters"}[:rng.IntN(4)%3]
				for _, l := range labels {
					m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l), Value: proto.String(odd[rng.IntN(len(odd))])})
				}
				if rng.IntN(4) == 0 {
					m.TimestampMs = proto.Int64(1700000000000)
				}
				fam.Metric = append(fam.Metric, m)
				if _, ok := vllm.want[name]; ok {
					s := sample{family: name, value: m.GetGauge().GetValue()}
					for _, l := range m.Label {
						s.labels = append(s.labels, labelPair{l.GetName(), l.GetValue()})
					}
					want = append(want, s)
				}
			}
			if len(fam.Metric) > 0 {
				if _, err := expfmt.MetricFamilyToText(&text, fam); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := scan(text.Bytes(), vllm.want, vllm.maxLen)
		if err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, text.String())
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d samples, want %d\n%s", round, len(got), len(want), text.String())
		}
		for i := range got {
			g, w := got[i], want[i]
			// The encoder sorts labels by name.
			slices.SortFunc(w.labels, func(a, b labelPair) int { return strings.Compare(a.name, b.name) })
			if g.family != w.family || g.value != w.value || !slices.Equal(g.labels, w.labels) {
				t.Fatalf("round %d sample %d: got %+v, want %+v\n%s", round, i, g, w, text.String())
			}
		}
	}
}

func TestScanRejectsMalformedLines(t *testing.T) {
	vllm := Builtin(VLLM)
	for _, line := range []string{
		`vllm:num_requests_waiting{a="1"`,
		`vllm:num_requests_waiting{a=1} 2`,
		`vllm:num_requests_waiting{a="unterminated} 2`,
		`vllm:num_requests_waiting{a="bad\q"} 2`,
		`vllm:num_requests_waiting`,
		`vllm:num_requests_waiting twelve`,
		`vllm:num_requests_waiting 1 2 3`,
	} {
		t.Run(line, func(t *testing.T) {
			if _, err := scan([]byte(line+"\n"), vllm.want, vllm.maxLen); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// Lines of families the dialect does not read are not its business.
	if got, err := scan([]byte("other_metric{{{ garbage\nvllm:num_requests_waiting 3\n"), vllm.want, vllm.maxLen); err != nil || len(got) != 1 || got[0].value != 3 {
		t.Fatalf("got %+v %v", got, err)
	}
}

// exposition40KB is a vLLM exposition of a real server's size: histograms around
// the handful of series the picker needs.
func exposition40KB() []byte {
	var text strings.Builder
	text.WriteString("# HELP vllm:num_requests_waiting Waiting.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n")
	text.WriteString("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4\n")
	text.WriteString(`vllm:cache_config_info{block_size="16",num_gpu_blocks="27842"} 1` + "\n")
	for i := 0; text.Len() < 40<<10; i++ {
		text.WriteString("vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"" + strings.Repeat("9", i%5+1) + "\",model_name=\"m\"} 42\n")
	}
	return []byte(text.String())
}

// BenchmarkParse reads a 40 KB vLLM exposition, as every scrape does.
func BenchmarkParse(b *testing.B) {
	raw := exposition40KB()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if m, _, err := Parse(bytes.NewReader(raw), VLLM); err != nil || m.Waiting != 3 {
			b.Fatal(m, err)
		}
	}
}

// BenchmarkParseCustom reads an exposition of the same size through a custom map
// with label matchers and used over total.
func BenchmarkParseCustom(b *testing.B) {
	var text strings.Builder
	text.WriteString("myserver_requests{pool=\"a\",state=\"pending\"} 3\nmyserver_requests{pool=\"a\",state=\"active\"} 12\n")
	text.WriteString("myserver_kv_used_blocks 400\nmyserver_kv_total_blocks 1000\nmyserver_cache_info{block_size=\"16\"} 1\n")
	for i := 0; text.Len() < 40<<10; i++ {
		text.WriteString("myserver_latency_seconds_bucket{le=\"" + strings.Repeat("9", i%5+1) + "\",model=\"m\"} 42\n")
	}
	raw := []byte(text.String())
	m, err := NewMap(Custom, customSpec)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if got, _, err := m.Parse(bytes.NewReader(raw)); err != nil || got.Waiting != 3 || got.KVUsage != 0.4 {
			b.Fatal(got, err)
		}
	}
}

// BenchmarkParsePrometheus is the same exposition through the Prometheus text
// parser, which Parse used before it read only the lines it needs.
func BenchmarkParsePrometheus(b *testing.B) {
	raw := exposition40KB()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		p := expfmt.NewTextParser(model.UTF8Validation)
		if fams, err := p.TextToMetricFamilies(bytes.NewReader(raw)); err != nil || len(fams) == 0 {
			b.Fatal(err)
		}
	}
}
