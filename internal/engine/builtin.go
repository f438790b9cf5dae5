package engine

import "slices"

// The built-in maps, with the exporters their names were checked against
// (docs/metrics.md lists them per engine). A signal an engine does not publish
// is left out of its map, and a scrape reports it Missing.
var builtins = []struct {
	name Dialect
	spec MapSpec
}{
	// vLLM V1, vllm/v1/metrics/loggers.py; gpu_cache_usage_perc before 0.10.
	{VLLM, MapSpec{
		Queue:     named("vllm:num_requests_waiting"),
		Running:   named("vllm:num_requests_running"),
		KVUsage:   named("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
		BlockSize: info("vllm:cache_config_info", "block_size"),
		NumBlocks: info("vllm:cache_config_info", "num_gpu_blocks"),
		LoRA:      LoRASource{Name: "vllm:lora_requests_info", Running: "running_lora_adapters", Waiting: "waiting_lora_adapters", Max: "max_lora"},
	}},
	// SGLang, python/sglang/srt/metrics/collector.py.
	{SGLang, MapSpec{
		Queue:     named("sglang:num_queue_reqs"),
		Running:   named("sglang:num_running_reqs"),
		KVUsage:   named("sglang:token_usage"),
		BlockSize: info("sglang:cache_config_info", "page_size"),
		NumBlocks: info("sglang:cache_config_info", "num_pages"),
	}},
	// TensorRT-LLM's trtllm-serve, tensorrt_llm/metrics/collector.py.
	{TRTLLM, MapSpec{
		Queue:     named("trtllm_num_requests_waiting"),
		Running:   named("trtllm_num_requests_running"),
		KVUsage:   named("trtllm_kv_cache_utilization"),
		BlockSize: named("trtllm_kv_cache_tokens_per_block"),
		NumBlocks: named("trtllm_kv_cache_max_blocks"),
	}},
	// Triton's TensorRT-LLM backend: two families, the signal in a label.
	{Triton, MapSpec{
		Queue:     labelled("nv_trt_llm_request_metrics", "request_type", "waiting"),
		Running:   labelled("nv_trt_llm_request_metrics", "request_type", "scheduled"),
		KVUsage:   labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction"),
		BlockSize: labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per"),
		NumBlocks: labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"),
	}},
	// Hugging Face TGI's router (backends/v3, docs/source/reference/metrics.md):
	// no KV-cache gauge, no block size. Its gauges exist from their first set,
	// the queue's when a request first arrives.
	{TGI, MapSpec{
		Queue:      named("tgi_queue_size"),
		Running:    named("tgi_batch_current_size"),
		LazyGauges: true,
	}},
	// llama.cpp's llama-server --metrics (tools/server): requests waiting for a
	// slot are deferred. kv_cache_usage_ratio (used cells / context) was
	// dropped from /metrics in 2025; builds before that still carry it.
	{LlamaCpp, MapSpec{
		Queue:   named("llamacpp:requests_deferred"),
		Running: named("llamacpp:requests_processing"),
		KVUsage: named("llamacpp:kv_cache_usage_ratio"),
	}},
}

func named(names ...string) Source { return Source{Names: names} }

func info(name, label string) Source { return Source{Names: []string{name}, Label: label} }

func labelled(name, key, value string) Source {
	return Source{Names: []string{name}, Match: map[string]string{key: value}}
}

// builtinMaps are the built-in maps by dialect, and detectAll reads the
// families of all of them, to detect which one an exposition speaks.
var builtinMaps, detectAll = func() (map[Dialect]*Map, *Map) {
	out := map[Dialect]*Map{}
	all := &Map{name: "", want: map[string]string{}}
	for _, b := range builtins {
		m, err := NewMap(b.name, b.spec)
		if err != nil {
			panic(err)
		}
		out[b.name] = m
		for f := range m.want {
			_ = all.add("", f)
		}
		all.queue.names = append(all.queue.names, m.queue.names...)
		all.running.names = append(all.running.names, m.running.names...)
	}
	return out, all
}()

// Builtin is the built-in map of a dialect; nil for one without (Custom, "").
func Builtin(d Dialect) *Map { return builtinMaps[d] }

// builtinNames lists the dialects with a built-in map, in order.
func builtinNames() []string {
	out := make([]string, len(builtins))
	for i, b := range builtins {
		out[i] = string(b.name)
	}
	return out
}

// detect is the first built-in map, in order, whose queue or running metric
// the exposition carries.
func detect(x exposition) *Map {
	for _, b := range builtins {
		m := builtinMaps[b.name]
		for _, s := range x {
			if slices.Contains(m.queue.names, s.family) || slices.Contains(m.running.names, s.family) {
				return m
			}
		}
	}
	return nil
}
