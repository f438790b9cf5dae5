package v1alpha1

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// config is a valid one-scheduler document, edited by each case.
func config(edit func(*InferenceGatewayConfig)) *InferenceGatewayConfig {
	c := &InferenceGatewayConfig{Spec: InferenceGatewayConfigSpec{Schedulers: []SchedulerSpec{{
		Name: "a", ModelName: "m", ModelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
	}}}}
	if edit != nil {
		edit(c)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func src(name string) *MetricSource { return &MetricSource{MetricSelector: MetricSelector{Name: name}} }

// custom sets scheduler 0 to engineType custom with the map m.
func custom(m *MetricMap) func(*InferenceGatewayConfig) {
	return func(c *InferenceGatewayConfig) {
		c.Spec.Schedulers[0].EngineType, c.Spec.Schedulers[0].Metrics = EngineCustom, m
	}
}

func TestValidateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		edit       func(*InferenceGatewayConfig)
		path, want string
	}{
		{"bbr replicas", func(c *InferenceGatewayConfig) { c.Spec.BBR.Replicas = ptr(int32(2)) }, "spec.bbr.replicas", MsgReplicas},
		{"scheduler replicas", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].Replicas = ptr(int32(1)) }, "spec.schedulers[0].replicas", MsgReplicas},
		{"no endpoint source", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].ModelSelector = nil }, "spec.schedulers[0]", MsgEndpointSource},
		{"selector and poolRef", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].PoolRef = "pool" }, "spec.schedulers[0]", MsgEndpointSource},
		{"selector, poolRef and endpoints", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].PoolRef, c.Spec.Schedulers[0].Endpoints = "pool", []string{"h:80"}
		}, "spec.schedulers[0]", MsgEndpointSource},
		{"empty selector", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].ModelSelector = &metav1.LabelSelector{} }, "spec.schedulers[0].modelSelector", MsgEmptySelector},
		{"selector with empty lists", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].ModelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{}, MatchExpressions: []metav1.LabelSelectorRequirement{}}
		}, "spec.schedulers[0].modelSelector", MsgEmptySelector},
		{"targetPort zero", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].TargetPort = ptr(int32(0)) }, "spec.schedulers[0].targetPort", "must be a port between 1 and 65535, got 0"},
		{"targetPort too high", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].TargetPort = ptr(int32(65536)) }, "spec.schedulers[0].targetPort", "must be a port between 1 and 65535, got 65536"},
		{"body limit low", func(c *InferenceGatewayConfig) { c.Spec.BBR.MaxRequestBodyBytes = ptr(int64(1023)) }, "spec.bbr.maxRequestBodyBytes", "must be between 1024 and 1073741824"},
		{"staleAfter below the default interval", func(c *InferenceGatewayConfig) {
			c.Spec.Gateway.Scrape = &ScrapeSpec{StaleAfter: dur(49 * time.Millisecond)}
		}, "spec.gateway.scrape.staleAfter", "must be at least the scrape interval (50ms)"},
		{"connectTimeout zero", func(c *InferenceGatewayConfig) { c.Spec.Gateway.ConnectTimeout = dur(0) }, "spec.gateway.connectTimeout", "must be between 1ns and 1m"},
		{"adapter twice", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].LoRAAdapters = []string{"x", "x"} }, "spec.schedulers[0].loraAdapters[1]", "is already served by spec.schedulers[0].loraAdapters[0]"},
		{"adapter is the model", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].LoRAAdapters = []string{"m"} }, "spec.schedulers[0].loraAdapters[0]", "is already served by spec.schedulers[0]"},
		{"unknown engine", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].EngineType = "ollama" }, "spec.schedulers[0].engineType", `"ollama" is not one of vllm, sglang, trtllm, triton, tgi, llamacpp, custom`},
		{"custom without a map", custom(nil), "spec.schedulers[0].metrics", MsgCustomMetrics},
		{"custom with blocks alone", custom(&MetricMap{NumBlocks: &IntegerSource{MetricSource: *src("blocks")}}), "spec.schedulers[0].metrics", MsgCustomMetrics},
		{"a map without an engineType", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].Metrics = &MetricMap{Queue: src("q")} }, "spec.schedulers[0].metrics", MsgMetricsEngine},
		{"kvUsed without kvTotal", custom(&MetricMap{KVUsed: src("used")}), "spec.schedulers[0].metrics", MsgKVUsedTotal},
		{"kvTotal without kvUsed", custom(&MetricMap{Queue: src("q"), KVTotal: src("total")}), "spec.schedulers[0].metrics", MsgKVUsedTotal},
		{"metric name", custom(&MetricMap{Queue: src("my-server.queue")}), "spec.schedulers[0].metrics.queue.name", `"my-server.queue" is not a Prometheus metric name`},
		{"metric name missing", custom(&MetricMap{Running: src("")}), "spec.schedulers[0].metrics.running.name", "is required"},
		{"metric name too long", custom(&MetricMap{Queue: src(strings.Repeat("q", 257))}), "spec.schedulers[0].metrics.queue.name", "is not a Prometheus metric name"},
		{"label name", custom(&MetricMap{Queue: &MetricSource{MetricSelector: MetricSelector{Name: "q", Labels: map[string]string{"state": "a", "pool-name": "b"}}}}),
			"spec.schedulers[0].metrics.queue.labels.pool-name", `"pool-name" is not a Prometheus label name`},
		{"too many labels", custom(&MetricMap{Queue: &MetricSource{MetricSelector: MetricSelector{Name: "q", Labels: func() map[string]string {
			m := map[string]string{}
			for i := range 17 {
				m[fmt.Sprintf("l%d", i)] = "x"
			}
			return m
		}()}}}), "spec.schedulers[0].metrics.queue.labels", "has 17 labels, at most 16 allowed"},
		{"scale zero", custom(&MetricMap{KVUsage: &MetricSource{MetricSelector: MetricSelector{Name: "kv"}, Scale: "0"}}), "spec.schedulers[0].metrics.kvUsage.scale", "must be > 0, got 0"},
		{"scale negative", custom(&MetricMap{KVUsage: &MetricSource{MetricSelector: MetricSelector{Name: "kv"}, Scale: "-0.01"}}), "spec.schedulers[0].metrics.kvUsage.scale", "must be > 0"},
		{"scale no number", custom(&MetricMap{KVUsage: &MetricSource{MetricSelector: MetricSelector{Name: "kv"}, Scale: "lots"}}), "spec.schedulers[0].metrics.kvUsage.scale", `"lots" is not a number`},
		{"info label", custom(&MetricMap{Queue: src("q"), BlockSize: &IntegerSource{MetricSource: *src("info"), Label: "block size"}}), "spec.schedulers[0].metrics.blockSize.label", "is not a Prometheus label name"},
		{"lora without running label", custom(&MetricMap{Queue: src("q"), LoRA: &LoRASource{MetricSelector: MetricSelector{Name: "lora_info"}}}), "spec.schedulers[0].metrics.lora.runningLabel", "is required"},
		{"client certificate without its key", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].AppProtocol, c.Spec.Schedulers[0].BackendTLS = AppProtocolHTTPS, &BackendTLSSpec{CertFile: "/c"}
		}, "spec.schedulers[0].backendTLS", "certFile and keyFile go together"},
		{"lora label", custom(&MetricMap{Queue: src("q"), LoRA: &LoRASource{MetricSelector: MetricSelector{Name: "lora_info"}, RunningLabel: "running", MaxLabel: "max-lora"}}), "spec.schedulers[0].metrics.lora.maxLabel", "is not a Prometheus label name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := config(tc.edit).Validate()
			for _, e := range errs {
				if e.Path == tc.path && strings.Contains(e.Message, tc.want) {
					return
				}
			}
			t.Fatalf("Validate() = %v, want %s: ...%s...", errs, tc.path, tc.want)
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*InferenceGatewayConfig)
	}{
		{"selector", nil},
		{"selector by expression", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].ModelSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}
		}},
		{"poolRef only", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].ModelSelector, c.Spec.Schedulers[0].PoolRef = nil, "pool"
		}},
		{"endpoints only", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].ModelSelector, c.Spec.Schedulers[0].Endpoints = nil, []string{"10.0.0.1:8000", "[::1]:1", "vllm.models.svc:65535", "h:080"}
		}},
		// As the controller resolves it: the endpoints are the selected pods.
		{"selector with the endpoints it resolved to", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].Endpoints = []string{"10.0.0.1:8000"} }},
		{"poolRef with the endpoints it resolved to", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].ModelSelector, c.Spec.Schedulers[0].PoolRef, c.Spec.Schedulers[0].Endpoints = nil, "pool", []string{"10.0.0.1:8000"}
		}},
		{"staleAfter equals the interval", func(c *InferenceGatewayConfig) {
			c.Spec.Gateway.Scrape = &ScrapeSpec{Interval: dur(time.Second), StaleAfter: dur(time.Second)}
		}},
		{"staleAfter equals the default interval", func(c *InferenceGatewayConfig) {
			c.Spec.Gateway.Scrape = &ScrapeSpec{StaleAfter: dur(DefaultScrapeInterval)}
		}},
		{"every engine type", func(c *InferenceGatewayConfig) {
			for _, e := range EngineTypes {
				if e != EngineCustom {
					c.Spec.Schedulers = append(c.Spec.Schedulers, SchedulerSpec{Name: "e-" + e, ModelName: e, Endpoints: []string{"h:1"}, EngineType: e})
				}
			}
			c.Spec.BBR.Enabled = true
		}},
		{"a custom map", custom(&MetricMap{
			Queue:     &MetricSource{MetricSelector: MetricSelector{Name: "myserver_requests", Labels: map[string]string{"state": "pending", "pool": ""}}},
			KVUsage:   &MetricSource{MetricSelector: MetricSelector{Name: "myserver:kv_percent"}, Scale: "0.01"},
			KVUsed:    src("used"),
			KVTotal:   &MetricSource{MetricSelector: MetricSelector{Name: "total"}, Scale: "1e3"},
			BlockSize: &IntegerSource{MetricSource: *src("myserver_cache_info"), Label: "block_size"},
			NumBlocks: &IntegerSource{MetricSource: *src("myserver_blocks")},
			LoRA:      &LoRASource{MetricSelector: MetricSelector{Name: "myserver_lora"}, RunningLabel: "running", WaitingLabel: "waiting", MaxLabel: "max_lora"},
		})},
		{"custom with running alone", custom(&MetricMap{Running: src("active")})},
		{"custom with used over total alone", custom(&MetricMap{KVUsed: src("used"), KVTotal: src("total")})},
		// A map beside a built-in engineType overrides its signals.
		{"a built-in map overridden", func(c *InferenceGatewayConfig) {
			c.Spec.Schedulers[0].EngineType = "tgi"
			c.Spec.Schedulers[0].Metrics = &MetricMap{KVUsed: src("tgi_batch_current_max_tokens"), KVTotal: src("my_kv_tokens")}
		}},
		{"bounds", func(c *InferenceGatewayConfig) {
			c.Spec.BBR.MaxRequestBodyBytes = ptr(int64(1 << 30))
			g := &c.Spec.Gateway
			g.MaxAttempts, g.QueueTimeout, g.ConnectTimeout = ptr(int32(10)), dur(time.Minute), dur(time.Minute)
			g.OutlierDetection = &OutlierSpec{BaseEjectionTime: dur(time.Hour), MaxEjectionPercent: ptr(int32(100))}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if errs := config(tc.edit).Validate(); len(errs) > 0 {
				t.Fatalf("Validate() = %v", errs)
			}
		})
	}
}

func TestHostPort(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"127.0.0.1:8000", true}, {"h:1", true}, {"h:65535", true}, {"h:0065535", true}, {"[::1]:80", true}, {"[fe80::1%eth0]:80", true},
		{"h:0", false}, {"h:65536", false}, {"h:99999", false}, {"h:+80", false}, {"h:", false}, {":80", false}, {"h", false},
		{"::1:80", false}, {"[::1]80", false}, {"[]:80", false}, {"[::1]:80]", false}, {"a:b:80", false}, {"h:8o", false},
	} {
		if got := hostPort.MatchString(tc.s); got != tc.ok {
			t.Errorf("%q: matched %v, want %v", tc.s, got, tc.ok)
		}
	}
}

// TestMarkersMatch: the CRD is generated from the markers in types.go; they
// must say what Validate says, in the same words.
func TestMarkersMatch(t *testing.T) {
	src, err := os.ReadFile("types.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"+kubebuilder:validation:items:Pattern=`" + HostPortPattern + "`",
		`message="` + MsgReplicas + `",fieldPath=".replicas"`,
		`message="` + MsgEndpointSource + `"`,
		`message="` + MsgEmptySelector + `"`,
		`message="` + MsgMetricsEngine + `",fieldPath=".metrics"`,
		`message="` + MsgCustomMetrics + `",fieldPath=".metrics"`,
		`message="` + MsgKVUsedTotal + `"`,
		"+kubebuilder:validation:Pattern=`" + MetricNamePattern + "`",
		"+kubebuilder:validation:Pattern=`" + LabelNamePattern + "`",
		"+kubebuilder:validation:Enum=" + strings.Join(EngineTypes, ";"),
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("types.go has no marker %s", want)
		}
	}
	if n := strings.Count(string(src), `message="`+MsgReplicas+`"`); n != 2 {
		t.Errorf("the replicas message is on %d markers, want 2 (bbr and schedulers[])", n)
	}
}
