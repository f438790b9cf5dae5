package route

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/fleet"
)

// TestConfigHoldsThroughReloads: a request's configuration is the one it
// started under, whatever is applied between its steps. A reload lands
// between every step — authentication, body limits, body rules, the pick —
// and each answers as the first configuration says.
func TestConfigHoldsThroughReloads(t *testing.T) {
	g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true}})
	defer g.Close()
	// Each configuration differs from the others in every rule a step reads.
	variant := func(n int) *v1alpha1.InferenceGatewayConfig {
		limit := int64(2048 * (n + 1))
		sc := schedulerSpec("s", llama, fmt.Sprintf("10.0.0.%d:8000", n+1))
		if n == 0 {
			sc.SessionAffinity = &v1alpha1.SessionAffinitySpec{FromUser: true}
			sc.LoRAAdapters = []string{"adapter-a"}
		}
		return &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{
			BBR:        v1alpha1.BBRSpec{MaxRequestBodyBytes: &limit},
			Schedulers: []v1alpha1.SchedulerSpec{sc},
			Auth:       &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: fmt.Sprint("tenant-", n), Hash: auth.HashKey(fmt.Sprint("key-", n))}}},
			Gateway:    v1alpha1.GatewaySpec{Diagnostics: &v1alpha1.DiagnosticsSpec{Expose: n == 0}},
		}}
	}
	if err := g.Apply(variant(0)); err != nil {
		t.Fatal(err)
	}
	c := g.Current()
	n := 0
	reload := func() {
		n++
		if err := g.Apply(variant(1 + n%2)); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name  string
		check func() error
	}{
		{"authentication", func() error {
			h := http.Header{"Authorization": {"Bearer key-0"}}
			id, ref := c.Authenticate(h, "")
			if ref != nil {
				return fmt.Errorf("key-0 refused: %s", ref.Message)
			}
			if id == nil || id.Tenant != "tenant-0" {
				return fmt.Errorf("key-0: identity %v; want tenant-0", id)
			}
			if _, ref := c.Authenticate(http.Header{"Authorization": {"Bearer key-1"}}, ""); ref == nil {
				return fmt.Errorf("key-1 of a later configuration: accepted, want 401")
			} else if ref.Status != http.StatusUnauthorized {
				return fmt.Errorf("key-1 of a later configuration: %d, want 401", ref.Status)
			}
			return nil
		}},
		{"credentials stripped", func() error {
			if !c.AuthEnabled() {
				return fmt.Errorf("auth off")
			}
			return nil
		}},
		{"body limit", func() error {
			if got := c.MaxBody(); got != 2048 {
				return fmt.Errorf("MaxBody %d, want 2048", got)
			}
			return nil
		}},
		{"body rules", func() error {
			if !c.WantsUser() {
				return fmt.Errorf("WantsUser false: the first configuration keys sessions by user")
			}
			if base, ok := c.BaseModel("adapter-a"); !ok || base != llama {
				return fmt.Errorf("BaseModel(adapter-a) = %q, %v", base, ok)
			}
			return nil
		}},
		{"models", func() error {
			if ms := c.Models(nil); len(ms) != 2 {
				return fmt.Errorf("%d models, want the base and its adapter", len(ms))
			}
			return nil
		}},
		{"the pick", func() error {
			rt, ref := c.Route(context.Background(), Request{Model: llama, User: "u", Identity: &auth.Identity{Tenant: "tenant-0", Method: auth.MethodAPIKey}})
			if ref != nil {
				return fmt.Errorf("refused: %s", ref.Message)
			}
			defer rt.Finish(Outcome{Status: 200})
			if rt.Endpoints[0] != "10.0.0.1:8000" || !rt.Expose {
				return fmt.Errorf("routed to %v (expose %v), want the first configuration's endpoint, exposed", rt.Endpoints, rt.Expose)
			}
			return nil
		}},
	}
	for _, s := range steps {
		reload()
		if err := s.check(); err != nil {
			t.Errorf("after %d reloads, %s: %v", n, s.name, err)
		}
	}
	// A request arriving now gets the configuration serving now.
	if now := g.Current(); now.MaxBody() == 2048 || now.WantsUser() {
		t.Errorf("a new request reads the old configuration: MaxBody %d", now.MaxBody())
	}
}

// TestZeroConfig: a Config no router handed out refuses, as before any
// configuration, and does not panic.
func TestZeroConfig(t *testing.T) {
	var c Config
	if c.Configured() || c.MaxBody() != 0 || c.WantsUser() || c.AuthEnabled() || len(c.Models(nil)) != 0 {
		t.Error("the zero Config reads as configured")
	}
	if id, ref := c.Authenticate(http.Header{}, ""); id != nil || ref != nil {
		t.Errorf("Authenticate: %v, %v", id, ref)
	}
	if rt, ref := c.Route(context.Background(), Request{Model: llama}); rt != nil || ref == nil || ref.Status != http.StatusServiceUnavailable {
		t.Errorf("Route: %v, %v; want 503", rt, ref)
	}
}
