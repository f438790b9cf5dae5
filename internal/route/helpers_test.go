package route

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/promtest"
)

const llama = "meta-llama/Llama-3.1-8B-Instruct"

func schedulerSpec(name, model string, endpoints ...string) v1alpha1.SchedulerSpec {
	return v1alpha1.SchedulerSpec{Name: name, ModelName: model, Endpoints: endpoints}
}

// testConfig is a configuration of the given schedulers and nothing else.
func testConfig(schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
	return &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: schedulers}}
}

// admission sets spec.gateway's in-flight limit per endpoint and queue timeout.
func admission(cfg *v1alpha1.InferenceGatewayConfig, limit int32, wait time.Duration) {
	cfg.Spec.Gateway.MaxInFlightPerEndpoint = &limit
	cfg.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: wait}
}

// clock is a test router's virtual clock: it moves only when the test moves
// it, so nothing a test asserts depends on how busy the machine is.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts at the real time: a request's routeTimeout is a real
// context deadline counted from its start on this clock.
func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock d forward.
func (c *clock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the clock to t, never back.
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

// newRouter starts a router on clk that scrapes nothing (endpoints' metrics
// come by Observe) and applies cfg; opts change its options first.
func newRouter(t testing.TB, clk *clock, cfg *v1alpha1.InferenceGatewayConfig, opts ...func(*Options)) *Router {
	t.Helper()
	o := Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true, Now: clk.Now}}
	for _, f := range opts {
		f(&o)
	}
	g := New(o)
	t.Cleanup(g.Close)
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	return g
}

// observe feeds m as a scrape of each of addrs taken now.
func observe(g *Router, clk *clock, m engine.Metrics, addrs ...string) {
	for _, a := range addrs {
		g.Observe(a, m, engine.VLLM, clk.Now())
	}
}

// pick routes req under the current configuration and fails the test on a
// refusal.
func pick(t testing.TB, g *Router, req Request) *Route {
	t.Helper()
	r, ref := g.Current().Route(context.Background(), req)
	if ref != nil {
		t.Fatalf("request for %q refused: %d %s", req.Model, ref.Status, ref.Message)
	}
	return r
}

// served routes n requests one after the other, each finished with a 200
// before the next, and counts where they went.
func served(t testing.TB, g *Router, n int, req func(i int) Request) map[string]int {
	t.Helper()
	return routeEach(t, g, n, req, func(r *Route) { r.Finish(Outcome{Status: 200}) })
}

// held routes n requests and keeps them all in flight, as a burst arriving
// between two scrapes does; it counts where they went. The test's cleanup
// finishes them.
func held(t testing.TB, g *Router, n int, req func(i int) Request) map[string]int {
	t.Helper()
	return routeEach(t, g, n, req, func(r *Route) { t.Cleanup(func() { r.Finish(Outcome{Status: 200}) }) })
}

// routeEach routes n requests, passes each Route to then, and counts where
// they went.
func routeEach(t testing.TB, g *Router, n int, req func(i int) Request, then func(*Route)) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		r := pick(t, g, req(i))
		out[r.Served()]++
		then(r)
	}
	return out
}

// model is a request for llama with no prompt.
func model(int) Request { return Request{Model: llama} }

// metric reads one of the router's metrics with the given labels (0 when
// absent; a histogram's count).
func metric(t testing.TB, g *Router, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Value(t, g.Metrics().Registry, name, labels...)
}
