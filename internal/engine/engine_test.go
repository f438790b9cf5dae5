package engine

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
)

// same compares two scrapes field by field.
func same(a, b Metrics) bool {
	return a.Waiting == b.Waiting && a.Running == b.Running && a.KVUsage == b.KVUsage && a.BlockSize == b.BlockSize &&
		a.NumBlocks == b.NumBlocks && a.HasLoRA == b.HasLoRA && a.MaxLoRA == b.MaxLoRA && a.Missing == b.Missing &&
		slices.Equal(a.RunningAdapters, b.RunningAdapters) && slices.Equal(a.WaitingAdapters, b.WaitingAdapters)
}

const (
	noBlocksLoRA = SignalBlocks | SignalLoRA
	onlyLoad     = SignalKVUsage | SignalBlocks | SignalLoRA // queue and running only
)

// tgiExposition is what TGI's router (metrics-exporter-prometheus) serves once
// it has taken requests: untyped names, no labels, histograms around.
const tgiExposition = `
# TYPE tgi_request_count counter
tgi_request_count 57
# TYPE tgi_request_success counter
tgi_request_success 49
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9216
# TYPE tgi_batch_inference_count counter
tgi_batch_inference_count{method="prefill"} 50
tgi_batch_inference_count{method="decode"} 4096
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 3
tgi_request_duration_bucket{le="+Inf"} 49
tgi_request_duration_sum 123.5
tgi_request_duration_count 49
`

// llamaCppExposition is llama-server --metrics as tools/server writes it now:
// every series HELP and TYPE, no labels, no KV-cache gauge.
const llamaCppExposition = `
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4821
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 9034
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.87
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 41.2
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
`

func TestParseExpositions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect Dialect // "" detects
		text    string
		want    Metrics
		wantD   Dialect
	}{
		{"vllm", "", `
vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="0",model_name="m"} 7
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="27842"} 1
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters="c"} 1.8e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9
`, Metrics{Waiting: 3, Running: 7, KVUsage: 0.42, BlockSize: 16, NumBlocks: 27842, HasLoRA: true, MaxLoRA: 2,
			RunningAdapters: []string{"b"}, WaitingAdapters: []string{"c"}}, VLLM},
		{"vllm legacy KV name, two engines", VLLM, `
vllm:num_requests_waiting{engine="0"} 1
vllm:num_requests_waiting{engine="1"} 2
vllm:num_requests_running{engine="0"} 4
vllm:gpu_cache_usage_perc{engine="0"} 0.2
vllm:gpu_cache_usage_perc{engine="1"} 0.9
`, Metrics{Waiting: 3, Running: 4, KVUsage: 0.9, Missing: noBlocksLoRA}, VLLM},
		{"vllm prefers the current KV name", VLLM, "vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n",
			Metrics{KVUsage: 0.1, Missing: SignalRunning | noBlocksLoRA}, VLLM},
		{"sglang", "", `
sglang:num_queue_reqs{model_name="m"} 5
sglang:num_running_reqs{model_name="m"} 9
sglang:token_usage{model_name="m"} 0.7
sglang:cache_config_info{num_pages="1000",page_size="32"} 1
`, Metrics{Waiting: 5, Running: 9, KVUsage: 0.7, BlockSize: 32, NumBlocks: 1000, Missing: SignalLoRA}, SGLang},
		{"trtllm", "", `
trtllm_num_requests_waiting{engine_type="trtllm"} 2
trtllm_num_requests_running{engine_type="trtllm"} 6
trtllm_kv_cache_utilization{engine_type="trtllm"} 0.5
trtllm_kv_cache_tokens_per_block 64
trtllm_kv_cache_max_blocks 4096
`, Metrics{Waiting: 2, Running: 6, KVUsage: 0.5, BlockSize: 64, NumBlocks: 4096, Missing: SignalLoRA}, TRTLLM},
		{"triton", "", `
nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="m",request_type="scheduled",version="1"} 8
nv_trt_llm_request_metrics{model="m",request_type="active",version="1"} 12
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m",version="1"} 128
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 512
`, Metrics{Waiting: 4, Running: 8, KVUsage: 0.25, BlockSize: 128, NumBlocks: 512, Missing: SignalLoRA}, Triton},
		{"tgi", "", tgiExposition, Metrics{Waiting: 3, Running: 5, Missing: onlyLoad}, TGI},
		// TGI's gauges exist from their first set: a router yet to take a
		// request exports none, and says nothing of its load.
		{"tgi before its first request", TGI, "# nothing yet\n", Metrics{Missing: AllSignals}, TGI},
		{"tgi with its queue gauge alone", TGI, "tgi_queue_size 1\n", Metrics{Waiting: 1, Missing: SignalRunning | onlyLoad}, TGI},
		{"llama.cpp", "", llamaCppExposition, Metrics{Waiting: 2, Running: 4, Missing: onlyLoad}, LlamaCpp},
		{"llama.cpp before the KV gauges were dropped", LlamaCpp, llamaCppExposition + `
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.375
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 3072
`, Metrics{Waiting: 2, Running: 4, KVUsage: 0.375, Missing: noBlocksLoRA}, LlamaCpp},
		{"usage clamped", VLLM, "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.3\n", Metrics{KVUsage: 1, Missing: SignalRunning | noBlocksLoRA}, VLLM},
		{"NaN is no reading", VLLM, "vllm:num_requests_waiting 2\nvllm:num_requests_running NaN\n", Metrics{Waiting: 2, Missing: SignalRunning | SignalKVUsage | noBlocksLoRA}, VLLM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, d, err := Parse(strings.NewReader(strings.TrimSpace(tc.text)+"\n"), tc.dialect)
			if err != nil {
				t.Fatal(err)
			}
			if d != tc.wantD || !same(got, tc.want) {
				t.Fatalf("got %+v (%s, missing %v), want %+v (%s, missing %v)", got, d, got.Missing.Names(), tc.want, tc.wantD, tc.want.Missing.Names())
			}
		})
	}
}

// customSpec reads a server of no known engine: requests by state in one
// family, the KV cache in blocks, a percentage, an info metric, LoRA.
var customSpec = MapSpec{
	Queue:     Source{Names: []string{"myserver_requests"}, Match: map[string]string{"state": "pending"}},
	Running:   Source{Names: []string{"myserver_requests"}, Match: map[string]string{"state": "active"}},
	KVUsed:    Source{Names: []string{"myserver_kv_used_blocks"}},
	KVTotal:   Source{Names: []string{"myserver_kv_total_blocks"}},
	BlockSize: Source{Names: []string{"myserver_cache_info"}, Label: "block_size"},
	NumBlocks: Source{Names: []string{"myserver_kv_total_blocks"}},
	LoRA:      LoRASource{Name: "myserver_adapters", Running: "loaded"},
}

func TestCustomMaps(t *testing.T) {
	percent := customSpec
	percent.KVUsage = Source{Names: []string{"myserver_kv_usage_percent"}, Scale: 0.01}
	perPool := customSpec
	perPool.Queue.Match = map[string]string{"state": "pending", "pool": "a"}
	unlabelled := MapSpec{Queue: Source{Names: []string{"q"}, Match: map[string]string{"pool": ""}}}
	for _, tc := range []struct {
		name string
		spec MapSpec
		text string
		want Metrics
	}{
		{"label matchers, used over total, an info label, LoRA", customSpec, `
# HELP myserver_requests Requests by state.
# TYPE myserver_requests gauge
myserver_requests{pool="a",state="pending"} 2
myserver_requests{pool="b",state="pending"} 1
myserver_requests{pool="a",state="active"} 6
myserver_requests{pool="a",state="finished"} 9000
myserver_kv_used_blocks 250
myserver_kv_total_blocks 1000
myserver_cache_info{block_size="32"} 1
myserver_adapters{loaded="sql, chat"} 1
`, Metrics{Waiting: 3, Running: 6, KVUsage: 0.25, BlockSize: 32, NumBlocks: 1000, HasLoRA: true, RunningAdapters: []string{"sql", "chat"}}},
		{"more matchers select fewer series", perPool, `myserver_requests{pool="a",state="pending"} 2
myserver_requests{pool="b",state="pending"} 1
`, Metrics{Waiting: 2, Missing: SignalRunning | SignalKVUsage | SignalBlocks | SignalLoRA}},
		{"a percentage scaled, preferred to used over total", percent, `myserver_requests{state="active"} 1
myserver_kv_usage_percent{gpu="0"} 42
myserver_kv_usage_percent{gpu="1"} 64
myserver_kv_used_blocks 1
myserver_kv_total_blocks 1000
`, Metrics{Running: 1, KVUsage: 0.64, NumBlocks: 1000, Missing: SignalQueue | SignalBlocks | SignalLoRA}},
		{"used over a total of 0 is no reading", customSpec, "myserver_requests{state=\"active\"} 1\nmyserver_kv_used_blocks 0\nmyserver_kv_total_blocks 0\n",
			Metrics{Running: 1, Missing: SignalQueue | SignalKVUsage | SignalBlocks | SignalLoRA}},
		{"used without total is no reading", customSpec, "myserver_requests{state=\"active\"} 1\nmyserver_kv_used_blocks 10\n",
			Metrics{Running: 1, Missing: SignalQueue | SignalKVUsage | SignalBlocks | SignalLoRA}},
		{"an empty matcher selects series without the label", unlabelled, "q{pool=\"a\"} 5\nq 2\nq{pool=\"\"} 1\n",
			Metrics{Waiting: 3, Missing: SignalRunning | SignalKVUsage | SignalBlocks | SignalLoRA}},
		{"a block size that is no number", customSpec, "myserver_requests{state=\"active\"} 1\nmyserver_cache_info{block_size=\"big\"} 1\nmyserver_kv_total_blocks 10\n",
			Metrics{Running: 1, NumBlocks: 10, Missing: SignalQueue | SignalKVUsage | SignalBlocks | SignalLoRA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMap(Custom, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, d, err := m.Parse(strings.NewReader(tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if d != Custom || !same(got, tc.want) {
				t.Fatalf("got %+v (%s, missing %v), want %+v (missing %v)", got, d, got.Missing.Names(), tc.want, tc.want.Missing.Names())
			}
		})
	}
}

func TestNewMapRefuses(t *testing.T) {
	q := Source{Names: []string{"q"}}
	for _, tc := range []struct {
		name, want string
		spec       MapSpec
	}{
		{"nothing to read", "reads none of queue, running and kvUsage", MapSpec{BlockSize: Source{Names: []string{"b"}}}},
		{"metric name", `"my-server.queue" is not a metric name`, MapSpec{Queue: Source{Names: []string{"my-server.queue"}}}},
		{"label name", `"a:b" is not a label name`, MapSpec{Queue: Source{Names: []string{"q"}, Match: map[string]string{"a:b": "x"}}}},
		{"info label name", `"9lives" is not a label name`, MapSpec{Queue: q, BlockSize: Source{Names: []string{"i"}, Label: "9lives"}}},
		{"negative scale", "scale -1 is not a positive number", MapSpec{Queue: Source{Names: []string{"q"}, Scale: -1}}},
		{"NaN scale", "scale NaN", MapSpec{Queue: Source{Names: []string{"q"}, Scale: math.NaN()}}},
		{"used without total", "kvUsed and kvTotal go together", MapSpec{Queue: q, KVUsed: Source{Names: []string{"u"}}}},
		{"a label on a gauge", "only blockSize and numBlocks read a label", MapSpec{Queue: Source{Names: []string{"q"}, Label: "n"}}},
		{"matchers without a name", "without a metric name", MapSpec{Queue: q, Running: Source{Match: map[string]string{"a": "b"}}}},
		{"LoRA without running", "lora: needs the metric name and the label of the running adapters", MapSpec{Queue: q, LoRA: LoRASource{Name: "l"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewMap(Custom, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// A built-in map overridden: the signals set replace its own, the rest stay.
func TestOverride(t *testing.T) {
	tgi, err := Builtin(TGI).Override(MapSpec{
		KVUsed:  Source{Names: []string{"tgi_batch_current_max_tokens"}},
		KVTotal: Source{Names: []string{"my_kv_tokens"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, d, err := tgi.Parse(strings.NewReader(tgiExposition + "my_kv_tokens 36864\n"))
	if err != nil || d != TGI || !same(got, Metrics{Waiting: 3, Running: 5, KVUsage: 0.25, Missing: noBlocksLoRA}) {
		t.Fatalf("tgi: %+v %s %v", got, d, err)
	}
	if got, _, err := tgi.Parse(strings.NewReader("")); err != nil || got.Missing != AllSignals {
		t.Fatalf("the override lost TGI's lazy gauges: %+v %v", got, err)
	}
	vllm, err := Builtin(VLLM).Override(MapSpec{Queue: Source{Names: []string{"vllm:num_requests_waiting"}, Match: map[string]string{"engine": "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err = vllm.Parse(strings.NewReader("vllm:num_requests_waiting{engine=\"0\"} 4\nvllm:num_requests_waiting{engine=\"1\"} 1\nvllm:kv_cache_usage_perc 0.5\n"))
	if err != nil || !same(got, Metrics{Waiting: 1, KVUsage: 0.5, Missing: SignalRunning | noBlocksLoRA}) {
		t.Fatalf("vllm: %+v %v", got, err)
	}
	// The KV usage is replaced as a whole: used over total, not vLLM's gauge.
	kv, err := Builtin(VLLM).Override(MapSpec{KVUsed: named("my_used"), KVTotal: named("my_total")})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err = kv.Parse(strings.NewReader("vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.9\nmy_used 1\nmy_total 4\n"))
	if err != nil || !same(got, Metrics{Waiting: 1, KVUsage: 0.25, Missing: SignalRunning | noBlocksLoRA}) {
		t.Fatalf("vllm, KV overridden: %+v %v", got, err)
	}
	if Builtin(VLLM).Spec().Queue.Match != nil {
		t.Fatal("the override changed the built-in map")
	}
}

func TestParseErrors(t *testing.T) {
	custom, err := NewMap(Custom, customSpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text, want string
		m                *Map
	}{
		{"unknown exposition", "process_cpu_seconds_total 1\n", "no known model-server metrics (looked for vllm:num_requests_waiting, ", nil},
		{"not an exposition", "{{{ nonsense\n", "no known model-server metrics", nil},
		{"the wrong engine", "vllm:num_requests_waiting 1\n", "no sglang metrics: the exposition carries none of sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage", Builtin(SGLang)},
		{"blocks alone are no reading", "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"10\"} 1\n", "no vllm metrics", Builtin(VLLM)},
		{"a server exporting none of the map's names", "myserver_pending 1\nvllm:num_requests_waiting 1\n",
			"no custom metrics: the exposition carries none of myserver_requests, myserver_requests, myserver_kv_used_blocks, myserver_kv_total_blocks", custom},
		{"matchers selecting nothing", "myserver_requests{state=\"finished\"} 3\n", "no custom metrics", custom},
		{"a malformed line of a family read", "myserver_requests{state=\"pending\"} 1\nmyserver_kv_used_blocks{gpu=0} 3\n", "line 2: myserver_kv_used_blocks: malformed label", custom},
		{"a value that is no number", "myserver_requests{state=\"pending\"} many\n", `value "many"`, custom},
		{"a map that failed to build", "vllm:num_requests_waiting 1\n", "no map", Refusing(errors.New("no map"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := tc.m.Parse(strings.NewReader(tc.text)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// Lines of families a map does not read are not its business.
	if _, _, err := custom.Parse(strings.NewReader("other{{{ garbage\nmyserver_requests{state=\"pending\"} 1\n")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Parse(strings.NewReader("vllm:num_requests_waiting 1\n"), Custom); err == nil || !strings.Contains(err.Error(), `unknown engine type "custom"`) {
		t.Fatalf("Parse with custom and no map: %v", err)
	}
}

// Every dialect the simulator exports parses to the engine's own state, with
// the signals its engine does not publish Missing.
func TestParseSimulator(t *testing.T) {
	custom, err := NewMap(Custom, customSpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d       simserver.Dialect
		legacy  bool
		m       *Map // nil: detected
		missing Signals
	}{
		{simserver.DialectVLLM, false, nil, SignalLoRA},
		{simserver.DialectSGLang, false, nil, SignalLoRA},
		{simserver.DialectTRTLLM, false, nil, SignalLoRA},
		{simserver.DialectTriton, false, nil, SignalLoRA},
		{simserver.DialectTGI, false, Builtin(TGI), onlyLoad},
		{simserver.DialectLlamaCpp, false, nil, onlyLoad},
		{simserver.DialectLlamaCpp, true, nil, noBlocksLoRA},
		{simserver.DialectCustom, false, custom, SignalLoRA},
	} {
		t.Run(fmt.Sprintf("%s legacy=%v", tc.d, tc.legacy), func(t *testing.T) {
			s := simtest.Start(t, simserver.Options{Dialect: tc.d, LegacyNames: tc.legacy, Engine: sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 5000, MaxNumSeqs: 2}})
			for range 5 {
				go func() {
					body := `{"model":"m","prompt":"` + strings.Repeat("word ", 500) + `","max_tokens":300,"ignore_eos":true}`
					resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
					if err == nil {
						resp.Body.Close()
					}
				}()
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				resp, err := http.Get("http://" + s.Addr() + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				m, dialect, err := tc.m.Parse(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if blocks := !tc.missing.Has(SignalBlocks); string(dialect) != string(tc.d) || blocks && (m.NumBlocks != 5000 || m.BlockSize != 16) {
					t.Fatalf("dialect %s, blocks %d × %d", dialect, m.NumBlocks, m.BlockSize)
				}
				if m.Running == 2 && m.Waiting == 3 && (m.KVUsage > 0 || tc.missing.Has(SignalKVUsage)) {
					if m.Missing != tc.missing {
						t.Fatalf("missing %v, want %v", m.Missing.Names(), tc.missing.Names())
					}
					return // the two running and three queued requests, and their KV blocks
				}
				if time.Now().After(deadline) {
					t.Fatalf("never saw 2 running and 3 waiting: last %+v", m)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestParseRecordsMissingSignals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect Dialect
		text    string
		missing Signals
	}{
		{"vllm with everything", VLLM, "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.1\n" +
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1` + "\n" +
			`vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1` + "\n", 0},
		{"vllm without KV usage", VLLM, "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n", SignalKVUsage | SignalBlocks | SignalLoRA},
		{"vllm with a KV usage of 0", VLLM, "vllm:num_requests_waiting 1\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n", SignalBlocks | SignalLoRA},
		{"sglang queue only", SGLang, "sglang:num_queue_reqs 3\n", SignalRunning | SignalKVUsage | SignalBlocks | SignalLoRA},
		{"vllm without its queue", VLLM, "vllm:kv_cache_usage_perc 0.1\n", SignalQueue | SignalRunning | SignalBlocks | SignalLoRA},
		{"trtllm without blocks", TRTLLM, "trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 1\ntrtllm_kv_cache_utilization 0.3\n", SignalBlocks | SignalLoRA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, err := Parse(strings.NewReader(tc.text), tc.dialect)
			if err != nil {
				t.Fatal(err)
			}
			if m.Missing != tc.missing {
				t.Fatalf("missing %v, want %v", m.Missing.Names(), tc.missing.Names())
			}
			if m.Published()|m.Missing != AllSignals || m.Published()&m.Missing != 0 {
				t.Fatalf("published %v and missing %v do not partition the signals", m.Published().Names(), m.Missing.Names())
			}
		})
	}
}

// TestMapsDocumented: docs/metrics.md lists, under each engine, every metric
// name its built-in map reads.
func TestMapsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range builtinNames() {
		_, section, ok := strings.Cut(string(doc), "(`engineType: "+name+"`)")
		if !ok {
			t.Errorf("docs/metrics.md has no section for engineType %s", name)
			continue
		}
		section, _, _ = strings.Cut(section, "\n#")
		for _, f := range Builtin(Dialect(name)).Families() {
			if !strings.Contains(section, "`"+f) {
				t.Errorf("docs/metrics.md does not list %s under engineType %s", f, name)
			}
		}
	}
}

// TestBounded: metrics from elsewhere are brought into a parse's ranges.
func TestBounded(t *testing.T) {
	m := Metrics{Waiting: math.NaN(), Running: -3, KVUsage: 7, BlockSize: -1, NumBlocks: 1 << 40, MaxLoRA: 5,
		RunningAdapters: make([]string, 5000)}.Bounded()
	if m.Waiting != 0 || m.Running != 0 || m.KVUsage != 1 || m.BlockSize != 0 || m.NumBlocks != 1<<24 || m.MaxLoRA != 5 || len(m.RunningAdapters) != 1024 {
		t.Fatalf("%+v", m)
	}
}
