package route

import (
	"log/slog"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
)

// TestApplyKeepsUnchangedSchedulers: pods coming and going (an apply that
// changes only endpoints) keep a scheduler's picker and transport, and with
// them its open connections; any other change builds new ones.
func TestApplyKeepsUnchangedSchedulers(t *testing.T) {
	two := int32(2)
	for _, tc := range []struct {
		name string
		edit func(*v1alpha1.InferenceGatewayConfig)
		keep bool
	}{
		{"endpoints only", func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Schedulers[0].Endpoints = []string{"10.0.0.2:8000", "10.0.0.3:8000"}
		}, true},
		{"nothing", func(*v1alpha1.InferenceGatewayConfig) {}, true},
		{"weights", func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Schedulers[0].Weights = &v1alpha1.Weights{Queue: &two}
		}, false},
		{"app protocol", func(c *v1alpha1.InferenceGatewayConfig) { c.Spec.Schedulers[0].AppProtocol = v1alpha1.AppProtocolH2C }, false},
		{"gateway settings", func(c *v1alpha1.InferenceGatewayConfig) { c.Spec.Gateway.MaxAttempts = &two }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true}})
			defer g.Close()
			cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{schedulerSpec("s", llama, "10.0.0.1:8000")}}}
			if err := g.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			before := g.routes.Load().schedulers[0]
			next := cfg.DeepCopy()
			tc.edit(next)
			if err := g.Apply(next); err != nil {
				t.Fatal(err)
			}
			after := g.routes.Load().schedulers[0]
			if kept := after.transport == before.transport && after.picker == before.picker; kept != tc.keep {
				t.Errorf("picker and transport kept: %v, want %v", kept, tc.keep)
			}
			if len(after.endpoints) != len(next.Spec.Schedulers[0].Endpoints) {
				t.Errorf("endpoints %d, want %d", len(after.endpoints), len(next.Spec.Schedulers[0].Endpoints))
			}
		})
	}
}
