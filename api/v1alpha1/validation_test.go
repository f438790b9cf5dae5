package v1alpha1

import (
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
		{"body limit low", func(c *InferenceGatewayConfig) { c.Spec.BBR.MaxRequestBodyBytes = ptr(int64(1023)) }, "spec.bbr.maxRequestBodyBytes", "must be between 1024 and 1073741824"},
		{"staleAfter below the default interval", func(c *InferenceGatewayConfig) {
			c.Spec.Gateway.Scrape = &ScrapeSpec{StaleAfter: dur(49 * time.Millisecond)}
		}, "spec.gateway.scrape.staleAfter", "must be at least the scrape interval (50ms)"},
		{"connectTimeout zero", func(c *InferenceGatewayConfig) { c.Spec.Gateway.ConnectTimeout = dur(0) }, "spec.gateway.connectTimeout", "must be between 1ns and 1m"},
		{"adapter twice", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].LoRAAdapters = []string{"x", "x"} }, "spec.schedulers[0].loraAdapters[1]", "is already served by spec.schedulers[0].loraAdapters[0]"},
		{"adapter is the model", func(c *InferenceGatewayConfig) { c.Spec.Schedulers[0].LoRAAdapters = []string{"m"} }, "spec.schedulers[0].loraAdapters[0]", "is already served by spec.schedulers[0]"},
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
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("types.go has no marker %s", want)
		}
	}
	if n := strings.Count(string(src), `message="`+MsgReplicas+`"`); n != 2 {
		t.Errorf("the replicas message is on %d markers, want 2 (bbr and schedulers[])", n)
	}
}
