package route

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/promtest"
)

// TestFinish: how each way a request ends is counted — the code label every
// front shares, the duration (only for requests an endpoint answered), the load
// summary's window (which judges the endpoint, not the client) — and that the
// endpoint's slot comes back.
func TestFinish(t *testing.T) {
	for _, tc := range []struct {
		name      string
		o         Outcome
		code      string
		durations float64
		errors    bool // counted as a failure in the load summary
		meanSeen  bool // in the summary's mean duration (a 200 window)
		penalised bool // counted against the endpoint for routing (its error rate)
	}{
		{"answered", Outcome{Status: 200}, "200", 1, false, true, false},
		{"server error", Outcome{Status: 503}, "503", 1, false, false, true},
		{"overloaded", Outcome{Status: 429}, "429", 1, false, false, true},
		{"broke mid-stream", Outcome{Status: 200, StreamError: true}, "stream_error", 1, true, false, true},
		{"client left a 200", Outcome{Status: 200, ClientGone: true}, "499", 1, false, true, false},
		{"client left before an answer", Outcome{Unanswered: true}, "499", 0, false, false, false},
		{"refused after the pick", Outcome{Status: 413, Unanswered: true}, "413", 0, false, false, false},
		{"never seen", Outcome{Status: StatusUnseen}, "unseen", 1, false, false, false},
		{"every endpoint failed", Outcome{Status: 503, Unanswered: true, EndpointsFailed: true}, "503", 0, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true, Now: func() time.Time { return now }}})
			defer g.Close()
			cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{schedulerSpec("s", llama, "10.0.0.1:8000")}}}
			if err := g.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			rt, ref := g.Route(context.Background(), Request{Model: llama})
			if ref != nil {
				t.Fatal(ref)
			}
			now = now.Add(time.Second)
			rt.Finish(tc.o)
			rt.Finish(Outcome{Status: 200}) // a second Finish changes nothing
			reg := g.Metrics().Registry
			if n := promtest.Value(t, reg, "kvgate_requests_total", "code", tc.code); n != 1 {
				t.Errorf("kvgate_requests_total{code=%q} = %v, want 1", tc.code, n)
			}
			if n := promtest.Value(t, reg, "kvgate_request_duration_seconds"); n != tc.durations {
				t.Errorf("durations observed %v, want %v", n, tc.durations)
			}
			if rate := g.FleetView()[0].Endpoints[0].ErrorRate; (rate > 0) != tc.penalised {
				t.Errorf("the endpoint's error rate %v, want penalised=%v", rate, tc.penalised)
			}
			if n := g.FleetView()[0].Endpoints[0].InFlight; n != 0 {
				t.Errorf("in flight after Finish: %d", n)
			}
			m := g.Summary().Models[0]
			if got := m.ErrorRate == 1; got != tc.errors {
				t.Errorf("summary error rate %v, want failure=%v", m.ErrorRate, tc.errors)
			}
			if got := m.MeanDurationSeconds > 0; got != tc.meanSeen {
				t.Errorf("summary mean duration %v, want counted=%v", m.MeanDurationSeconds, tc.meanSeen)
			}
		})
	}
}
