package route

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestAdmission: how the core refuses a request it cannot place — the status,
// whether a retry soon is worth it (Retry-After), the message, the shed
// reason counted — and how long it waits before it does. The queue timeout
// and routeTimeout run on real timers: the waits here are short.
func TestAdmission(t *testing.T) {
	const queue = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		// cfg edits the configuration: one scheduler p of llama on ep1 and
		// ep2, at most one request in flight each, queue timeout queue.
		cfg func(*v1alpha1.InferenceGatewayConfig)
		// before runs once the router is up: it fills slots, marks
		// endpoints down; cancel ends the request's context.
		before func(t *testing.T, g *Router, cancel context.CancelFunc)
		req    Request
		status int
		retry  bool // Retry-After set
		msg    string
		shed   string // the kvgate_shed_total reason counted, "" for none
		// waits says the refusal comes only after the queue timeout (or
		// routeTimeout); otherwise it comes at once.
		waits bool
	}{
		{name: "no endpoint", cfg: func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Schedulers[0].Endpoints = nil
			c.Spec.Schedulers[0].ModelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}
		}, status: http.StatusServiceUnavailable, retry: true, msg: "no ready endpoint", shed: "no_endpoint"},
		{name: "every endpoint down", before: func(t *testing.T, g *Router, _ context.CancelFunc) {
			for _, a := range []string{ep1, ep2} {
				for range 3 {
					g.PeerScrape(a, fleet.Result{Err: "connection refused", Unreachable: true})
				}
			}
		}, status: http.StatusServiceUnavailable, retry: true, msg: "no ready endpoint", shed: "no_endpoint"},
		{name: "empty subset hint", req: Request{Subset: []string{}},
			status: http.StatusServiceUnavailable, retry: true, msg: "subset", shed: "no_endpoint"},
		{name: "subset outside the scheduler", req: Request{Subset: []string{"10.9.9.9:8000"}},
			status: http.StatusServiceUnavailable, retry: true, msg: "subset", shed: "no_endpoint"},
		{name: "saturated", before: fill, status: http.StatusTooManyRequests, retry: true, msg: "in flight", shed: "saturated", waits: true},
		{name: "saturated, sheddable", cfg: func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}}
		}, before: fill, req: Request{Objective: "batch"}, status: http.StatusTooManyRequests, retry: true, msg: "sheddable", shed: "sheddable"},
		{name: "route timeout while waiting", cfg: func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: time.Minute}
			c.Spec.Schedulers[0].RouteTimeout = &metav1.Duration{Duration: queue}
		}, before: fill, status: http.StatusGatewayTimeout, msg: "route timeout", waits: true},
		{name: "client gone while waiting", cfg: func(c *v1alpha1.InferenceGatewayConfig) {
			c.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: time.Minute}
		}, before: func(t *testing.T, g *Router, cancel context.CancelFunc) {
			fill(t, g, nil)
			go func() {
				waittest.Until(t, 5*time.Second, "the request waiting", func() bool { return g.Waiting() == 1 })
				cancel()
			}()
		}, status: proxy.StatusClientClosed, msg: "client went away"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			cfg := testConfig(schedulerSpec("p", llama, ep1, ep2))
			admission(cfg, 1, queue)
			if tc.cfg != nil {
				tc.cfg(cfg)
			}
			g := newRouter(t, clk, cfg)
			observe(g, clk, engine.Metrics{}, ep1, ep2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.before != nil {
				tc.before(t, g, cancel)
			}
			req := tc.req
			req.Model = llama
			start := time.Now()
			clk.Set(start) // the request arrives now: its routeTimeout counts from here
			r, ref := g.Current().Route(ctx, req)
			took := time.Since(start)
			if ref == nil {
				t.Fatalf("served by %s, want a %d", r.Served(), tc.status)
			}
			if ref.Status != tc.status || (ref.RetryAfter > 0) != tc.retry || !strings.Contains(ref.Message, tc.msg) {
				t.Errorf("refusal %d Retry-After %d %q, want %d Retry-After set %v, saying %q", ref.Status, ref.RetryAfter, ref.Message, tc.status, tc.retry, tc.msg)
			}
			if tc.waits && took < queue {
				t.Errorf("refused after %v, before the %v wait", took, queue)
			}
			if !tc.waits && tc.status != proxy.StatusClientClosed && took > time.Second {
				t.Errorf("refused after %v, want at once", took)
			}
			if got := metric(t, g, "kvgate_requests_total", "code", proxy.Code(tc.status)); got != 1 {
				t.Errorf("kvgate_requests_total{code=%q} = %v, want 1", proxy.Code(tc.status), got)
			}
			if tc.shed != "" {
				if got := metric(t, g, "kvgate_shed_total", "reason", tc.shed); got != 1 {
					t.Errorf("kvgate_shed_total{reason=%q} = %v, want 1", tc.shed, got)
				}
			} else if got := metric(t, g, "kvgate_shed_total"); got != 0 {
				t.Errorf("kvgate_shed_total = %v, want none", got)
			}
			if n := g.Waiting(); n != 0 {
				t.Errorf("%d still registered as waiting", n)
			}
		})
	}
}

// fill takes the one slot of each of ep1 and ep2 until the test ends.
func fill(t *testing.T, g *Router, _ context.CancelFunc) {
	t.Helper()
	got := held(t, g, 2, model)
	if got[ep1] != 1 || got[ep2] != 1 {
		t.Fatalf("filling the slots: %v", got)
	}
}

// TestAdmissionWaits: a request finding every endpoint at its limit waits for
// a slot and gets the first one freed, its wait counted in Waiting meanwhile.
func TestAdmissionWaits(t *testing.T) {
	clk := newClock()
	cfg := testConfig(schedulerSpec("p", llama, ep1))
	admission(cfg, 1, time.Minute)
	g := newRouter(t, clk, cfg)
	observe(g, clk, engine.Metrics{}, ep1)
	holder := pick(t, g, Request{Model: llama})
	got := make(chan *Route, 1)
	go func() {
		r, ref := g.Current().Route(context.Background(), Request{Model: llama})
		if ref != nil {
			t.Errorf("the waiting request was refused: %d %s", ref.Status, ref.Message)
		}
		got <- r
	}()
	waittest.Until(t, 5*time.Second, "the second request waiting", func() bool { return g.Waiting() == 1 })
	select {
	case <-got:
		t.Fatal("the second request got a slot the first holds")
	case <-time.After(20 * time.Millisecond):
	}
	holder.Finish(Outcome{Status: http.StatusOK})
	select {
	case r := <-got:
		if r != nil {
			r.Finish(Outcome{Status: http.StatusOK})
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting request was not given the freed slot")
	}
	if n := g.Waiting(); n != 0 {
		t.Errorf("%d still registered as waiting", n)
	}
	if got := metric(t, g, "kvgate_shed_total"); got != 0 {
		t.Errorf("kvgate_shed_total = %v, want none", got)
	}
}
