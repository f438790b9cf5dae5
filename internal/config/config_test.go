package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

const valid = `apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata:
  name: demo
spec:
  bbr:
    enabled: true
  schedulers:
  - name: llama
    modelName: meta-llama/Llama-3.1-8B-Instruct
    endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]
    loraAdapters: [sql-expert]
    weights: {queue: 2, kvCache: 2, prefix: 3}
    profile: chat
    saturation: {queueDepth: 8, kvCachePercent: 90}
    prefix: {blockChars: 128, maxBlocks: 64}
    routeTimeout: 30s
  - name: qwen
    modelName: Qwen/Qwen2.5-32B
    modelSelector:
      matchLabels: {app: qwen}
    appProtocol: kubernetes.io/h2c
  gateway:
    maxAttempts: 2
    queueTimeout: 500ms
    scrape: {interval: 100ms, staleAfter: 1s, unhealthyAfter: 5}
`

func TestParseValid(t *testing.T) {
	cfg, err := Parse("igwc.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Spec.Schedulers
	if len(s) != 2 || s[0].Port() != 8000 || !s[1].H2C() || s[0].Timeout().String() != "30s" || *s[0].Weights.Prefix != 3 {
		t.Fatalf("decoded %+v", s)
	}
	if s[0].SaturationQueue() != 8 || s[0].SaturationKV() != 0.9 || s[0].PrefixBlockChars() != 128 || s[0].PrefixMaxBlocks() != 64 || s[0].PrefixCapacity() != 31250 || s[0].ProfileName() != "chat" {
		t.Errorf("scoring settings %+v", s[0])
	}
	if s[1].SaturationQueue() != 5 || s[1].SaturationKV() != 0.8 || s[1].PrefixBlockChars() != 64 || s[1].ProfileName() != "kvgate" {
		t.Errorf("scoring defaults %+v", s[1])
	}
	gw := cfg.Spec.Gateway
	if gw.Attempts() != 2 || cfg.Spec.BBR.MaxBodyBytes() != 256<<20 || gw.ScrapeInterval().String() != "100ms" || gw.StaleAfter().String() != "1s" || gw.UnhealthyAfter() != 5 || gw.ScrapeTimeout().String() != "1s" {
		t.Errorf("gateway %+v", cfg.Spec.Gateway)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		want           string // substring of the error, including file:line
	}{
		{"unknown field", "    weights: {queue: 2", "    scoreWeights: {queue: 2", "igwc.yaml:13: spec.schedulers[0].scoreWeights: unknown field"},
		{"unknown top field", "  gateway:\n", "  gatewy:\n", "igwc.yaml:23: spec.gatewy: unknown field"},
		{"wrong type", "    maxAttempts: 2", "    maxAttempts: two", `igwc.yaml:24: spec.gateway.maxAttempts: must be an integer, got "two"`},
		{"bool type", "    enabled: true", "    enabled: yes please", "igwc.yaml:7: spec.bbr.enabled: must be true or false"},
		{"list expected", `    loraAdapters: [sql-expert]`, `    loraAdapters: sql-expert`, "igwc.yaml:12: spec.schedulers[0].loraAdapters: must be a list"},
		{"duplicate model", "    modelName: Qwen/Qwen2.5-32B", "    modelName: meta-llama/Llama-3.1-8B-Instruct", `igwc.yaml:19: spec.schedulers[1].modelName: "meta-llama/Llama-3.1-8B-Instruct" is already served`},
		{"bbr required", "    enabled: true", "    enabled: false", "igwc.yaml:7: spec.bbr.enabled: must be true when there is more than one scheduler"},
		{"negative weight", "{queue: 2, kvCache: 2", "{queue: -1, kvCache: 2", "spec.schedulers[0].weights.queue: must be ≥ 0"},
		{"bad endpoint", `"127.0.0.1:8002"`, `"127.0.0.1:99999"`, "igwc.yaml:11: spec.schedulers[0].endpoints[1]"},
		{"bad protocol", "kubernetes.io/h2c", "grpc", `spec.schedulers[1].appProtocol: "grpc" is not`},
		{"bad picker", "    routeTimeout: 30s", "    routeTimeout: 30s\n    picker: best", `spec.schedulers[0].picker: "best" is not one of`},
		{"bad timeout", "    routeTimeout: 30s", "    routeTimeout: -5s", "spec.schedulers[0].routeTimeout: must not be negative"},
		{"bad duration", "    routeTimeout: 30s", "    routeTimeout: soon", `igwc.yaml:17: spec.schedulers[0].routeTimeout: time: invalid duration "soon"`},
		{"duration without unit", "interval: 100ms", "interval: \"30\"", `spec.gateway.scrape.interval: time: missing unit in duration "30"`},
		{"wrong api version", "gateway.kvgate.io/v1alpha1", "gateway.kvgate.io/v9", `igwc.yaml:1: apiVersion: is "gateway.kvgate.io/v9"`},
		{"wrong kind", "kind: InferenceGatewayConfig", "kind: Gateway", `igwc.yaml:2: kind: is "Gateway"`},
		{"no endpoints", `    endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]`, "", "igwc.yaml:9: spec.schedulers[0]: must take its endpoints from exactly one of modelSelector, poolRef (Kubernetes) or endpoints (static)"},
		{"selector and poolRef", "      matchLabels: {app: qwen}", "      matchLabels: {app: qwen}\n    poolRef: qwen-pool", "spec.schedulers[1]: must take its endpoints from exactly one of"},
		{"empty selector", "      matchLabels: {app: qwen}", "      matchLabels: {}", "igwc.yaml:20: spec.schedulers[1].modelSelector: selects every pod"},
		{"scheduler replicas", "    routeTimeout: 30s", "    routeTimeout: 30s\n    replicas: 2", "igwc.yaml:18: spec.schedulers[0].replicas: replicas is not supported: scale the kvgate Deployment instead (Helm value replicas)"},
		{"bbr replicas", "    enabled: true", "    enabled: true\n    replicas: 2", "igwc.yaml:8: spec.bbr.replicas: replicas is not supported"},
		{"endpoint port zero", `"127.0.0.1:8002"`, `"127.0.0.1:0"`, `igwc.yaml:11: spec.schedulers[0].endpoints[1]: "127.0.0.1:0" is not host:port with a port between 1 and 65535`},
		{"bad name", "  - name: qwen", "  - name: Qwen_32B", `spec.schedulers[1].name: "Qwen_32B" must be a DNS label`},
		{"adapter clash", "[sql-expert]", "[Qwen/Qwen2.5-32B]", "is already served"},
		{"yaml syntax", "  bbr:\n", "  bbr: [\n", "not valid YAML"},
		{"unquoted number as string", "    modelName: Qwen/Qwen2.5-32B", "    modelName: 3.10", `igwc.yaml:19: spec.schedulers[1].modelName: must be a string, got "3.10" (quote it)`},
		{"gateway attempts", "    maxAttempts: 2", "    maxAttempts: 0", "spec.gateway.maxAttempts: must be between 1 and 10"},
		{"beyond int32", "    maxAttempts: 2", "    maxAttempts: 1099511627776", "igwc.yaml:24: spec.gateway.maxAttempts: must be an integer between -2147483648 and 2147483647, got 1099511627776"},
		{"bad profile", "profile: chat", "profile: fast", `spec.schedulers[0].profile: "fast" is not one of`},
		{"saturation queue", "queueDepth: 8", "queueDepth: 0", "igwc.yaml:15: spec.schedulers[0].saturation.queueDepth: must be ≥ 1"},
		{"saturation kv", "kvCachePercent: 90", "kvCachePercent: 120", "spec.schedulers[0].saturation.kvCachePercent: must be between 1 and 100"},
		{"prefix block", "blockChars: 128", "blockChars: 2", "spec.schedulers[0].prefix.blockChars: must be between 8 and 4096"},
		{"prefix unknown field", "maxBlocks: 64", "maxBlock: 64", "spec.schedulers[0].prefix.maxBlock: unknown field"},
		{"scrape interval", "interval: 100ms", "interval: 1ms", "spec.gateway.scrape.interval: must be between 10ms and 1m"},
		{"duplicate objective", "  gateway:\n", "  objectives: [{name: chat, priority: 10}, {name: chat, priority: -1}]\n  gateway:\n", `spec.objectives[1].name: "chat" is already the name of spec.objectives[0]`},
		{"objective priority", "  gateway:\n", "  objectives: [{name: batch, priority: -5000}]\n  gateway:\n", "spec.objectives[0].priority: must be between -1000 and 1000"},
		{"objective without name", "  gateway:\n", "  objectives: [{priority: 1}]\n  gateway:\n", "spec.objectives[0].name: is required"},
		{"stale below interval", "staleAfter: 1s", "staleAfter: 50ms", "spec.gateway.scrape.staleAfter: must be at least the scrape interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(valid, tc.from, tc.to, 1)
			if doc == valid {
				t.Fatalf("test edit %q not applied", tc.from)
			}
			_, err := Parse("igwc.yaml", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("error is %T, not *config.Error", err)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	doc := strings.Replace(strings.Replace(valid, "weights: {queue: 2", "scoreWeights: {queue: 2", 1), "queueTimeout: 500ms", "queueTimout: 500ms", 1)
	_, err := Parse("x.yaml", []byte(doc))
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 2 {
		t.Fatalf("want two problems, got %v", err)
	}
}

func TestSecondDocumentRejected(t *testing.T) {
	_, err := Parse("two.yaml", []byte(valid+"---\n"+valid))
	if err == nil || !strings.Contains(err.Error(), "more than one document") {
		t.Fatalf("err = %v", err)
	}
}

func TestEmpty(t *testing.T) {
	for _, doc := range []string{"", "   \n", "- a\n- b\n", "just text"} {
		if _, err := Parse("e.yaml", []byte(doc)); err == nil {
			t.Errorf("%q accepted", doc)
		}
	}
}

// customMap is the example of docs/configuration.md's custom metric maps.
const customMap = `apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata:
  name: myserver
spec:
  schedulers:
  - name: myserver
    modelName: my-model
    endpoints: ["10.0.0.5:9000"]
    engineType: custom
    metrics:
      queue:   {name: myserver_requests, labels: {state: pending}}
      running: {name: myserver_requests, labels: {state: active}}
      kvUsage: {name: myserver_kv_usage_percent, scale: 0.01}
      kvUsed:  {name: myserver_kv_used_blocks}
      kvTotal: {name: myserver_kv_total_blocks}
      blockSize: {name: myserver_cache_info, label: block_size}
      numBlocks: {name: myserver_kv_total_blocks}
      lora: {name: myserver_lora_info, runningLabel: running, waitingLabel: waiting, maxLabel: max_lora}
`

func TestParseCustomMetricMap(t *testing.T) {
	cfg, err := Parse("custom.yaml", []byte(customMap))
	if err != nil {
		t.Fatal(err)
	}
	mm := cfg.Spec.Schedulers[0].Metrics
	if scale, _ := mm.KVUsage.Scale.Float64(); scale != 0.01 || mm.Queue.Labels["state"] != "pending" || mm.BlockSize.Label != "block_size" || mm.LoRA.MaxLabel != "max_lora" {
		t.Fatalf("decoded %+v", mm)
	}
	// A quoted scale reads the same, and the document survives a round trip.
	quoted, err := Parse("custom.yaml", []byte(strings.Replace(customMap, "scale: 0.01", `scale: "0.01"`, 1)))
	if err != nil || quoted.Spec.Schedulers[0].Metrics.KVUsage.Scale != "0.01" {
		t.Fatalf("quoted scale: %v", err)
	}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("again.yaml", out)
	if err != nil || again.Spec.Schedulers[0].Metrics.KVUsage.Scale != "0.01" {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	for _, tc := range []struct{ from, to, want string }{
		{"scale: 0.01", "scale: lots", `custom.yaml:14: spec.schedulers[0].metrics.kvUsage.scale: "lots" is not a number`},
		{"scale: 0.01", "scale: 0", "custom.yaml:14: spec.schedulers[0].metrics.kvUsage.scale: must be > 0, got 0"},
		{"labels: {state: pending}", "labels: {engine: 0}", `custom.yaml:12: spec.schedulers[0].metrics.queue.labels.engine: must be a string, got "0" (quote it)`},
		{"label: block_size", "lable: block_size", "custom.yaml:17: spec.schedulers[0].metrics.blockSize.lable: unknown field"},
		{"{name: myserver_kv_total_blocks}\n      blockSize", "{name: total-blocks}\n      blockSize", `spec.schedulers[0].metrics.kvTotal.name: "total-blocks" is not a Prometheus metric name`},
		{"    engineType: custom\n", "", "custom.yaml:10: spec.schedulers[0].metrics: needs an engineType"},
	} {
		_, err := Parse("custom.yaml", []byte(strings.Replace(customMap, tc.from, tc.to, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s → %s: err = %v\nwant it to contain %q", tc.from, tc.to, err, tc.want)
		}
	}
}

// The custom map of docs/configuration.md is the one above, and valid.
func TestDocumentedCustomMap(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "### Custom metric maps")
	_, block, _ := strings.Cut(section, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	cfg, err := Parse("configuration.md", []byte("apiVersion: gateway.kvgate.io/v1alpha1\nkind: InferenceGatewayConfig\nmetadata: {name: doc}\nspec:\n  schedulers:\n"+block))
	if err != nil {
		t.Fatalf("%v\n%s", err, block)
	}
	want, err := Parse("custom.yaml", []byte(customMap))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Spec.Schedulers[0].Metrics; !reflect.DeepEqual(got, want.Spec.Schedulers[0].Metrics) {
		t.Fatalf("docs: %+v\ntest: %+v", got, want.Spec.Schedulers[0].Metrics)
	}
}

// TestDecodeRenamed: a field under its former name is read under its new one
// and noted with its line; under both names it is an error; elsewhere in the
// document the former name is as unknown as any other.
func TestDecodeRenamed(t *testing.T) {
	type inner struct {
		URI  string   `json:"uri"`
		Tags []string `json:"tags,omitempty"`
	}
	type doc struct {
		A     inner  `json:"a"`
		Other *inner `json:"other,omitempty"`
	}
	renamed := []Renamed{{Path: "a", Old: "url", New: "uri"}, {Path: "a", Old: "tag", New: "tags"}}
	for _, tc := range []struct {
		name, yaml string
		want       doc
		warnings   []string
		err        string
	}{
		{name: "current names", yaml: "a:\n  uri: x\n", want: doc{A: inner{URI: "x"}}},
		{name: "former names", yaml: "a:\n  url: x\n  tag: [t]\n", want: doc{A: inner{URI: "x", Tags: []string{"t"}}},
			warnings: []string{"f.yaml:2: a.url is deprecated; use uri", "f.yaml:3: a.tag is deprecated; use tags"}},
		{name: "through an alias", yaml: "other: &b {url: x}\na: *b\n", want: doc{A: inner{URI: "x"}, Other: &inner{URI: "x"}},
			warnings: []string{"f.yaml:1: a.url is deprecated; use uri"}},
		{name: "both names", yaml: "a:\n  uri: x\n  url: y\n", err: "f.yaml:3: a.url: is the deprecated name of uri, which is set too: keep only uri"},
		{name: "former name elsewhere", yaml: "a: {uri: x}\nother: {url: y}\n", err: "f.yaml:2: other.url: unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got doc
			d, err := Decode("f.yaml", []byte(tc.yaml), &got, "test document", "a", renamed...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Decode: %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(d.Deprecated(), tc.warnings) {
				t.Fatalf("decoded %+v with warnings %q, want %+v with %q", got, d.Deprecated(), tc.want, tc.warnings)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no secret", "https://idp.example/jwks.json", "https://idp.example/jwks.json"},
		{"password", "https://user:pa55@idp.example/jwks", "https://user:xxxxx@idp.example/jwks"},
		{"query values", "https://idp.example/jwks?key=k3y&sig=abc", "https://idp.example/jwks?key=xxxxx&sig=xxxxx"},
		{"unparsable", "https://user:pa55@idp.example/%zz", "(unparsable URL)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactURL(tc.in); got != tc.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
