package simserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/internal/waittest"
)

func TestChatNonStreaming(t *testing.T) {
	_, base := startServer(t, Options{})
	c := sdk(base)
	resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(12),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Usage.CompletionTokens; got != 12 {
		t.Errorf("completion_tokens %d, want 12", got)
	}
	if got := resp.Choices[0].FinishReason; got != "length" {
		t.Errorf("finish_reason %q", got)
	}
	content := resp.Choices[0].Message.Content
	if n := tokenizer.Count(content); n != 12 {
		t.Errorf("content %q is %d tokens, usage says 12", content, n)
	}
	wantPrompt := tokenizer.Count("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nSay something.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
	if got := resp.Usage.PromptTokens; got != int64(wantPrompt) {
		t.Errorf("prompt_tokens %d, want %d", got, wantPrompt)
	}
	if resp.Usage.TotalTokens != resp.Usage.PromptTokens+resp.Usage.CompletionTokens {
		t.Errorf("total_tokens %d", resp.Usage.TotalTokens)
	}
	if resp.Object != "chat.completion" || resp.Model != testModel {
		t.Errorf("object %q model %q", resp.Object, resp.Model)
	}
}

func TestChatStreaming(t *testing.T) {
	_, base := startServer(t, Options{})
	c := sdk(base)
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to twenty.")},
		MaxTokens:     openai.Int(20),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithJSONSet("ignore_eos", true))
	var acc openai.ChatCompletionAccumulator
	contentChunks := 0
	var arrivals []time.Time
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			contentChunks++
			arrivals = append(arrivals, time.Now())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if contentChunks != 20 {
		t.Errorf("%d content chunks, want one per token (20)", contentChunks)
	}
	if acc.Usage.CompletionTokens != 20 || acc.Usage.PromptTokens == 0 {
		t.Errorf("usage %+v", acc.Usage)
	}
	if acc.Choices[0].FinishReason != "length" {
		t.Errorf("finish_reason %q", acc.Choices[0].FinishReason)
	}
	// Tokens arrive over time, one engine step (~7 ms on an H100) apart, not in one
	// burst; the bound leaves room for a slow CI machine to fall behind.
	if spread := arrivals[len(arrivals)-1].Sub(arrivals[0]); spread < 19*2*time.Millisecond {
		t.Errorf("20 tokens spread over %v; an H100 decode step is ~7 ms", spread)
	}
}

func TestCompletions(t *testing.T) {
	_, base := startServer(t, Options{})
	c := sdk(base)
	resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model:  testModel,
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.PromptTokens != int64(tokenizer.Count("Once upon a time")) {
		t.Errorf("prompt_tokens %d", resp.Usage.PromptTokens)
	}
	if resp.Usage.CompletionTokens < 1 || resp.Usage.CompletionTokens > 16 {
		t.Errorf("completion_tokens %d: the default max_tokens of completions is 16", resp.Usage.CompletionTokens)
	}

	tokens := []int64{101, 202, 303, 404, 505}
	stream := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
		Model:         testModel,
		Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: tokens},
		MaxTokens:     openai.Int(7),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if usage.PromptTokens != int64(len(tokens)) || usage.CompletionTokens != int64(tokenizer.Count(text.String())) {
		t.Errorf("usage %+v for text %q", usage, text.String())
	}
}

func TestRepeatedPromptHitsPrefixCache(t *testing.T) {
	// An A100 prefills a 6k-token prompt in about half a second, enough to see.
	_, base := startServer(t, Options{Engine: sim.Config{GPU: "a100", ModelSize: "8b"}})
	c := sdk(base)
	doc := strings.Repeat("The committee reviewed every clause of the agreement in detail. ", 400)
	ttft := func() (time.Duration, int64) {
		start := time.Now()
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model:         testModel,
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(doc), openai.UserMessage("Summarise.")},
			MaxTokens:     openai.Int(2),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var first time.Duration
		var cached int64
		for stream.Next() {
			ch := stream.Current()
			if first == 0 && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				first = time.Since(start)
			}
			if ch.Usage.TotalTokens > 0 {
				cached = ch.Usage.PromptTokensDetails.CachedTokens
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		return first, cached
	}
	cold, cachedCold := ttft()
	before := scrape(t, base)
	warm, cachedWarm := ttft()
	after := scrape(t, base)
	if cachedCold != 0 || cachedWarm < 5000 {
		t.Fatalf("cached tokens cold %d warm %d", cachedCold, cachedWarm)
	}
	if warm*3 > cold {
		t.Errorf("repeated prompt TTFT %v, not under a third of the first %v", warm, cold)
	}
	hits := value(t, after, "vllm:prefix_cache_hits_total") - value(t, before, "vllm:prefix_cache_hits_total")
	if hits != float64(cachedWarm) {
		t.Errorf("prefix_cache_hits_total rose by %v, usage says %d cached", hits, cachedWarm)
	}
	promptTokens := value(t, after, "vllm:prompt_tokens_total")
	if queries := value(t, after, "vllm:prefix_cache_queries_total"); queries != promptTokens {
		t.Errorf("prefix_cache_queries_total %v, want one lookup per prompt token (%v)", queries, promptTokens)
	}
}

func TestMetricsFollowLoad(t *testing.T) {
	_, base := startServer(t, Options{Engine: sim.Config{GPU: "a10g", ModelSize: "8b", MaxNumSeqs: 4}})
	c := sdk(base)
	idle := scrape(t, base)
	if value(t, idle, "vllm:num_requests_running", "model_name", testModel, "engine", "0") != 0 ||
		value(t, idle, "vllm:kv_cache_usage_perc") != 0 {
		t.Fatal("idle server reports load")
	}
	blocks := value(t, idle, "vllm:cache_config_info", "block_size", "16")
	if blocks != 1 {
		t.Fatal("cache_config_info is not 1")
	}
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:     testModel,
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("request %d: %s", i, strings.Repeat("lorem ipsum dolor ", 300)))},
				MaxTokens: openai.Int(15),
			}, option.WithJSONSet("ignore_eos", true))
			errs <- err
		})
	}
	var maxWaiting, maxRunning, maxKV float64
	waittest.Until(t, 20*time.Second, "load to show in metrics", func() bool {
		f := scrape(t, base)
		maxWaiting = max(maxWaiting, value(t, f, "vllm:num_requests_waiting"))
		maxRunning = max(maxRunning, value(t, f, "vllm:num_requests_running"))
		maxKV = max(maxKV, value(t, f, "vllm:kv_cache_usage_perc"))
		return maxWaiting >= 4 && maxRunning == 4 && maxKV > 0
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	f := scrape(t, base)
	if got := value(t, f, "vllm:request_success_total", "finished_reason", "length"); got != n {
		t.Errorf("request_success_total{length} = %v, want %d", got, n)
	}
	if got := value(t, f, "vllm:generation_tokens_total"); got != n*15 {
		t.Errorf("generation_tokens_total = %v, want %d", got, n*15)
	}
	if got := value(t, f, "vllm:time_to_first_token_seconds"); got != n {
		t.Errorf("TTFT histogram count %v, want %d", got, n)
	}
	if got := value(t, f, "vllm:inter_token_latency_seconds"); got != n*14 {
		t.Errorf("inter-token histogram count %v, want one per token gap (%d)", got, n*14)
	}
	// Queued requests were looked up in the prefix cache once each, not once per step
	// they waited.
	if q, p := value(t, f, "vllm:prefix_cache_queries_total"), value(t, f, "vllm:prompt_tokens_total"); q != p {
		t.Errorf("prefix_cache_queries_total %v != prompt_tokens_total %v under queueing", q, p)
	}
	if value(t, f, "vllm:num_requests_running") != 0 || value(t, f, "vllm:kv_cache_usage_perc") != 0 {
		t.Error("load did not drain from the metrics")
	}
}

func TestLoRAAdapters(t *testing.T) {
	_, base := startServer(t, Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxLoRAs: 2}, LoRAModules: []string{"sql"}})
	c := sdk(base)

	if code, e := post(t, base+"/v1/load_lora_adapter", `{"lora_name":"chat-fr","lora_path":"/adapters/fr"}`); code != 200 {
		t.Fatalf("load: %d %s", code, e.Error.Message)
	}
	if code, _ := post(t, base+"/v1/load_lora_adapter", `{"lora_name":"chat-fr","lora_path":"/adapters/fr"}`); code != 400 {
		t.Errorf("loading twice: %d, want 400", code)
	}
	if code, _ := post(t, base+"/v1/load_lora_adapter", `{"lora_name":"x"}`); code != 400 {
		t.Errorf("load without path: %d, want 400", code)
	}
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{testModel, "chat-fr", "sql"}) {
		t.Errorf("models %v", ids)
	}

	// While a request for the adapter runs, the newest lora_requests_info lists it.
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: "chat-fr", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Bonjour")}, MaxTokens: openai.Int(60),
	}, option.WithJSONSet("ignore_eos", true))
	if !stream.Next() {
		t.Fatal(stream.Err())
	}
	info := newestLoRAInfo(t, scrape(t, base))
	if info["running_lora_adapters"] != "chat-fr" || info["max_lora"] != "2" {
		t.Errorf("newest lora_requests_info %v", info)
	}
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if info := newestLoRAInfo(t, scrape(t, base)); info["running_lora_adapters"] != "" {
		t.Errorf("after the request, newest lora_requests_info %v", info)
	}

	if code, _ := post(t, base+"/v1/unload_lora_adapter", `{"lora_name":"chat-fr"}`); code != 200 {
		t.Fatalf("unload: %d", code)
	}
	if code, _ := post(t, base+"/v1/unload_lora_adapter", `{"lora_name":"chat-fr"}`); code != 404 {
		t.Errorf("unload twice: %d, want 404", code)
	}
	_, err = c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "chat-fr", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Bonjour")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("request for an unloaded adapter: %v, want 404", err)
	}
}

func TestBadInput(t *testing.T) {
	_, base := startServer(t, Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxModelLen: 4096}, MaxBodyBytes: 64 << 10})
	chat, comp := base+"/v1/chat/completions", base+"/v1/completions"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, url, body string
		status          int
		msg             string
	}{
		{"malformed JSON", chat, `{"model":`, 400, "malformed JSON"},
		{"not an object", chat, `[1,2]`, 400, "malformed JSON"},
		{"wrong type", chat, `{"model":"` + testModel + `",` + msgs + `,"max_tokens":"ten"}`, 400, "'max_tokens' must be a number"},
		{"stream not bool", chat, `{"model":"` + testModel + `",` + msgs + `,"stream":"yes"}`, 400, "'stream' must be a boolean"},
		{"missing model", chat, `{` + msgs + `}`, 400, "'model' is required"},
		{"no messages", chat, `{"model":"` + testModel + `","messages":[]}`, 400, "at least one message"},
		{"bad role", chat, `{"model":"` + testModel + `","messages":[{"role":"robot","content":"x"}]}`, 400, "robot"},
		{"bad content", chat, `{"model":"` + testModel + `","messages":[{"role":"user","content":7}]}`, 400, "content"},
		{"unknown model", chat, `{"model":"gpt-9",` + msgs + `}`, 404, "The model `gpt-9` does not exist."},
		{"zero max_tokens", chat, `{"model":"` + testModel + `",` + msgs + `,"max_tokens":0}`, 400, "at least 1"},
		{"n=3", chat, `{"model":"` + testModel + `",` + msgs + `,"n":3}`, 400, "'n'"},
		{"over context", chat, `{"model":"` + testModel + `",` + msgs + `,"max_tokens":5000}`, 400, "maximum context length is 4096 tokens"},
		{"prompt over context", comp, `{"model":"` + testModel + `","prompt":"` + strings.Repeat("word ", 5000) + `"}`, 400, "maximum context length"},
		{"prompt number", comp, `{"model":"` + testModel + `","prompt":5}`, 400, "'prompt' must be"},
		{"negative token", comp, `{"model":"` + testModel + `","prompt":[1,-2]}`, 400, "out of range"},
		{"token over 32 bits", comp, `{"model":"` + testModel + `","prompt":[4294967296]}`, 400, "out of range"},
		{"empty prompt", comp, `{"model":"` + testModel + `","prompt":""}`, 400, "empty"},
		{"two prompts", comp, `{"model":"` + testModel + `","prompt":["a","b"]}`, 400, "one prompt per request"},
		{"oversize body", comp, `{"model":"` + testModel + `","prompt":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "exceeds 65536 bytes"},
		{"unknown route", base + "/v1/embeddingz", `{}`, 404, "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, e := post(t, tc.url, tc.body)
			if code != tc.status || !strings.Contains(e.Error.Message, tc.msg) || e.Error.Code != tc.status {
				t.Fatalf("got %d %+v, want %d containing %q", code, e.Error, tc.status, tc.msg)
			}
		})
	}
	resp, err := http.Get(chat)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET chat: %d Allow=%q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	_, base := startServer(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	c := sdk(base)
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go on forever")}, MaxTokens: openai.Int(5000),
	}, option.WithJSONSet("ignore_eos", true))
	for i := 0; i < 3 && stream.Next(); i++ {
	}
	cancel()
	_ = stream.Close()
	waittest.Until(t, 5*time.Second, "the aborted sequence to leave the engine", func() bool {
		f := scrape(t, base)
		return value(t, f, "vllm:num_requests_running") == 0 &&
			value(t, f, "vllm:request_success_total", "finished_reason", "abort") == 1 &&
			value(t, f, "vllm:kv_cache_usage_perc") == 0
	})
}

func TestFaults(t *testing.T) {
	s, base := startServer(t, Options{})
	c := sdk(base)
	ask := func(ctx context.Context) error {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(3),
		})
		return err
	}
	setFaults := func(t *testing.T, f Faults) {
		t.Helper()
		if code := putJSON(t, base+"/admin/faults", f); code != 200 {
			t.Fatalf("PUT /admin/faults: %d", code)
		}
	}

	t.Run("error rate", func(t *testing.T) {
		setFaults(t, Faults{ErrorRate: 1, ErrorStatus: 503})
		var apiErr *openai.Error
		if err := ask(context.Background()); !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
			t.Fatalf("got %v, want 503", err)
		}
	})
	t.Run("added latency", func(t *testing.T) {
		setFaults(t, Faults{AddedLatency: Duration(150 * time.Millisecond)})
		start := time.Now()
		if err := ask(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Fatalf("answered in %v despite 150ms added latency", d)
		}
	})
	t.Run("hang", func(t *testing.T) {
		setFaults(t, Faults{HangRate: 1})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := ask(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the client's deadline", err)
		}
	})
	t.Run("close mid-stream", func(t *testing.T) {
		setFaults(t, Faults{CloseMidStreamRate: 1, CloseAfterTokens: 3})
		stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(50),
		}, option.WithJSONSet("ignore_eos", true))
		content := 0
		for stream.Next() {
			if ch := stream.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				content++
			}
		}
		if stream.Err() == nil || content != 3 {
			t.Fatalf("stream ended with err=%v after %d tokens, want an error after 3", stream.Err(), content)
		}
	})
	t.Run("refuse connections", func(t *testing.T) {
		setFaults(t, Faults{RefuseConnections: true})
		if _, err := getStatus(base + "/health"); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("health while refusing: %v", err)
		}
		// The listener is gone, so the fault is cleared through the Go API (the
		// fleet admin API does this over HTTP).
		if err := s.SetFaults(Faults{}); err != nil {
			t.Fatal(err)
		}
		if err := ask(context.Background()); err != nil {
			t.Fatalf("after clearing: %v", err)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		if code := putJSON(t, base+"/admin/faults", map[string]any{"errorRate": 2}); code != 400 {
			t.Errorf("errorRate 2 accepted: %d", code)
		}
		if code := putJSON(t, base+"/admin/faults", map[string]any{"errorRat": 0.5}); code != 400 {
			t.Errorf("unknown field accepted: %d", code)
		}
	})
}

func TestDialects(t *testing.T) {
	for _, tc := range []struct {
		dialect Dialect
		legacy  bool
		want    []string
		absent  string
	}{
		{DialectVLLM, true, []string{"vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting"}, "vllm:kv_cache_usage_perc"},
		{DialectSGLang, false, []string{"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info"}, "vllm:num_requests_waiting"},
		{DialectTRTLLM, false, []string{"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization", "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_max_blocks"}, "vllm:num_requests_waiting"},
		{DialectTriton, false, []string{"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"}, "vllm:num_requests_waiting"},
		{DialectTGI, false, []string{"tgi_queue_size", "tgi_batch_current_size", "tgi_request_count", "tgi_request_duration"}, "vllm:num_requests_waiting"},
		{DialectLlamaCpp, false, []string{"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:tokens_predicted_total"}, "llamacpp:kv_cache_usage_ratio"},
		{DialectLlamaCpp, true, []string{"llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens"}, "vllm:num_requests_waiting"},
		{DialectCustom, false, []string{CustomRequests, CustomKVUsedBlocks, CustomKVBlocks, CustomKVPercent, CustomCacheInfo}, "vllm:num_requests_waiting"},
	} {
		t.Run(fmt.Sprintf("%s legacy=%v", tc.dialect, tc.legacy), func(t *testing.T) {
			_, base := startServer(t, Options{Dialect: tc.dialect, LegacyNames: tc.legacy})
			c := sdk(base)
			if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello")}, MaxTokens: openai.Int(2),
			}); err != nil {
				t.Fatal(err)
			}
			f := scrape(t, base)
			for _, name := range tc.want {
				if _, ok := f[name]; !ok {
					t.Errorf("missing %s", name)
				}
			}
			if _, ok := f[tc.absent]; ok {
				t.Errorf("%s exported in the %s dialect", tc.absent, tc.dialect)
			}
		})
	}
	// TGI's router creates its series on first use: a fresh one has none.
	_, base := startServer(t, Options{Dialect: DialectTGI})
	for name := range scrape(t, base) {
		if strings.HasPrefix(name, "tgi_") {
			t.Errorf("a fresh TGI exports %s", name)
		}
	}
	_, base = startServer(t, Options{Dialect: DialectCustom, Engine: sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 1000}})
	f := scrape(t, base)
	if v := value(t, f, CustomKVBlocks); v != 1000 {
		t.Errorf("custom total blocks %v", v)
	}
	if v := value(t, f, CustomRequests, "state", "pending"); v != 0 {
		t.Errorf("custom pending %v", v)
	}
	_, base = startServer(t, Options{Dialect: DialectTriton, Engine: sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 1000}})
	f = scrape(t, base)
	if v := value(t, f, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"); v != 1000 {
		t.Errorf("triton max blocks %v", v)
	}
	if v := value(t, f, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per"); v != 16 {
		t.Errorf("triton tokens_per %v", v)
	}
}

func TestSameSeedSameAnswers(t *testing.T) {
	answer := func(seed uint64) string {
		_, base := startServer(t, Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", Seed: seed}})
		c := sdk(base)
		resp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(400),
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Choices[0].Message.Content
	}
	a, b, c := answer(7), answer(7), answer(8)
	if a != b {
		t.Error("same seed, different answers")
	}
	if a == c {
		t.Error("different seeds, same answer")
	}
}

func TestH2C(t *testing.T) {
	_, base := startServer(t, Options{})
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	c := sdk(base, option.WithHTTPClient(client))
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5),
	}, option.WithJSONSet("ignore_eos", true), option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(r)
		if err == nil && resp.ProtoMajor != 2 {
			t.Errorf("served over %s, want HTTP/2", resp.Proto)
		}
		return resp, err
	}))
	n := 0
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			n++
		}
	}
	if err := stream.Err(); err != nil || n != 5 {
		t.Fatalf("h2c stream: %d tokens, %v", n, err)
	}
}

// FuzzRequestBodies sends arbitrary bodies to both generation endpoints: every
// answer is a success or an OpenAI-shaped error whose code is the HTTP status, and
// nothing hangs or panics. A 256-token context keeps every request short.
func FuzzRequestBodies(f *testing.F) {
	for _, s := range []string{
		`{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"` + testModel + `","prompt":"hi","max_tokens":2,"stream":true}`,
		`{"model":"` + testModel + `","prompt":[1,2,3],"max_tokens":300}`,
		`{"model":1}`, `{`, `[]`, `null`, `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
	} {
		f.Add(s)
	}
	_, base := startServer(f, Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxModelLen: 256}})
	client := &http.Client{Timeout: 20 * time.Second}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatalf("%s %q: %v", path, body, err)
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s %q: reading: %v", path, body, err)
			}
			if resp.StatusCode == http.StatusOK {
				continue
			}
			var e openaiError
			if json.Unmarshal(raw, &e) != nil || e.Error.Message == "" || e.Error.Code != resp.StatusCode {
				t.Fatalf("%s %q: status %d with body %q", path, body, resp.StatusCode, raw)
			}
		}
	})
}

// Stopping a server cuts the streams it is serving (the client sees an error, not a
// clean end) and answers later requests with 503 rather than leaving them waiting.
func TestShutdownTruncatesStreams(t *testing.T) {
	s, err := New(Options{Model: testModel, Engine: sim.Config{GPU: "h100", ModelSize: "8b"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx) // the driver alone: the test serves the handler itself
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	c := sdk(srv.URL)
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("long answer")}, MaxTokens: openai.Int(5000),
	}, option.WithJSONSet("ignore_eos", true))
	for i := 0; i < 3 && stream.Next(); i++ {
	}
	cancel()
	for stream.Next() {
	}
	if stream.Err() == nil {
		t.Fatal("a stream cut by shutdown ended cleanly")
	}
	waittest.Until(t, 2*time.Second, "the server to refuse new work", func() bool {
		code, e := post(t, srv.URL+"/v1/completions", `{"model":"`+testModel+`","prompt":"hi"}`)
		return code == 503 && strings.Contains(e.Error.Message, "shutting down")
	})
}
