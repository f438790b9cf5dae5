package telemetry_test

import (
	"context"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/telemetry"
)

const pluginMetric = "kvgate_plugin_duration_seconds"

// TestPluginDurations: a decision through the routing core records, in the
// gateway's registry, one time for each filter and each scorer that ran.
func TestPluginDurations(t *testing.T) {
	m := telemetry.NewGateway()
	g := route.New(route.Options{Logger: slog.New(slog.DiscardHandler), Metrics: m, Fleet: fleet.Config{External: true}})
	defer g.Close()
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{
		{Name: "s", ModelName: "m", Endpoints: addrs, Profile: string(v1alpha1.ProfileGIEDefault)}}}}
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	// Every endpoint publishes every signal, so that each weighed scorer runs.
	for i, a := range addrs {
		g.Observe(a, engine.Metrics{Waiting: float64(i), KVUsage: 0.1 * float64(i)}, engine.VLLM, time.Now())
	}
	want := map[string]uint64{}
	for _, f := range schedule.Filters() {
		want[schedule.PointFilter+"/"+string(f.Name)] = 1
	}
	gie, err := schedule.LookupProfile(string(v1alpha1.ProfileGIEDefault))
	if err != nil {
		t.Fatal(err)
	}
	for n := range gie.Weights {
		want[schedule.PointScorer+"/"+string(n)] = 1
	}
	for _, tc := range []struct {
		name  string
		route bool // one decision first
		count uint64
	}{{"built, no decision yet", false, 0}, {"one decision", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.route {
				r, refusal := g.Route(context.Background(), route.Request{Model: "m", Prompt: []byte(`[{"role":"user","content":"hi"}]`)})
				if refusal != nil {
					t.Fatalf("refused: %+v", refusal)
				}
				r.Finish(route.Outcome{Status: 200})
			}
			if n, err := testutil.GatherAndCount(m.Registry, pluginMetric); err != nil || n != len(want) {
				t.Fatalf("%d series of %s (%v), want %d: %v", n, pluginMetric, err, len(want), want)
			}
			got := observations(t, m)
			wantNow := maps.Clone(want)
			for k := range wantNow {
				wantNow[k] = tc.count
			}
			if !maps.Equal(got, wantNow) {
				t.Errorf("observations %v, want %v", got, wantNow)
			}
		})
	}
}

// observations are the plugin histogram's sample counts by
// "extension_point/plugin".
func observations(t *testing.T, m *telemetry.Gateway) map[string]uint64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != pluginMetric {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["extension_point"]+"/"+labels["plugin"]] = s.GetHistogram().GetSampleCount()
		}
	}
	return out
}
