package engine

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
)

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
`, Metrics{Waiting: 3, Running: 4, KVUsage: 0.9}, VLLM},
		{"sglang", "", `
sglang:num_queue_reqs{model_name="m"} 5
sglang:num_running_reqs{model_name="m"} 9
sglang:token_usage{model_name="m"} 0.7
sglang:cache_config_info{num_pages="1000",page_size="32"} 1
`, Metrics{Waiting: 5, Running: 9, KVUsage: 0.7, BlockSize: 32, NumBlocks: 1000}, SGLang},
		{"trtllm", "", `
trtllm_num_requests_waiting{engine_type="trtllm"} 2
trtllm_num_requests_running{engine_type="trtllm"} 6
trtllm_kv_cache_utilization{engine_type="trtllm"} 0.5
trtllm_kv_cache_tokens_per_block 64
trtllm_kv_cache_max_blocks 4096
`, Metrics{Waiting: 2, Running: 6, KVUsage: 0.5, BlockSize: 64, NumBlocks: 4096}, TRTLLM},
		{"triton", "", `
nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="m",request_type="scheduled",version="1"} 8
nv_trt_llm_request_metrics{model="m",request_type="active",version="1"} 12
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m",version="1"} 128
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 512
`, Metrics{Waiting: 4, Running: 8, KVUsage: 0.25, BlockSize: 128, NumBlocks: 512}, Triton},
		{"usage clamped", VLLM, "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.3\n", Metrics{KVUsage: 1}, VLLM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, d, err := Parse(strings.NewReader(strings.TrimSpace(tc.text)+"\n"), tc.dialect)
			if err != nil {
				t.Fatal(err)
			}
			if d != tc.wantD || got.Waiting != tc.want.Waiting || got.Running != tc.want.Running || got.KVUsage != tc.want.KVUsage ||
				got.BlockSize != tc.want.BlockSize || got.NumBlocks != tc.want.NumBlocks || got.HasLoRA != tc.want.HasLoRA ||
				got.MaxLoRA != tc.want.MaxLoRA || !slices.Equal(got.RunningAdapters, tc.want.RunningAdapters) ||
				!slices.Equal(got.WaitingAdapters, tc.want.WaitingAdapters) {
				t.Fatalf("got %+v (%s), want %+v (%s)", got, d, tc.want, tc.wantD)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		dialect    Dialect
	}{
		{"unknown exposition", "process_cpu_seconds_total 1\n", ""},
		{"dialect without queue", "vllm:kv_cache_usage_perc 0.1\n", VLLM},
		{"not an exposition", "{{{ nonsense\n", ""},
		{"unknown dialect", "vllm:num_requests_waiting 1\n", "tgi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Parse(strings.NewReader(tc.text), tc.dialect); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// Every dialect the simulator exports parses to the engine's own state.
func TestParseSimulator(t *testing.T) {
	for _, d := range []simserver.Dialect{simserver.DialectVLLM, simserver.DialectSGLang, simserver.DialectTRTLLM, simserver.DialectTriton} {
		t.Run(string(d), func(t *testing.T) {
			s := simtest.Start(t, simserver.Options{Dialect: d, Engine: sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 5000, MaxNumSeqs: 2}})
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
				m, dialect, err := Parse(resp.Body, "")
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if string(dialect) != string(d) || m.NumBlocks != 5000 || m.BlockSize != 16 {
					t.Fatalf("dialect %s, blocks %d × %d", dialect, m.NumBlocks, m.BlockSize)
				}
				if m.Running == 2 && m.Waiting == 3 && m.KVUsage > 0 {
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
