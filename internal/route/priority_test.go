package route

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/waittest"
)

func TestWaitQueue(t *testing.T) {
	a, b := &endpoint{addr: "a"}, &endpoint{addr: "b"}
	p := &scheduler{endpoints: []*endpoint{a, b}}
	cands := func() []schedule.Endpoint { return []schedule.Endpoint{{Address: "a"}, {Address: "b"}} }
	addrs := func(c []schedule.Endpoint) (s []string) {
		for _, e := range c {
			s = append(s, e.Address)
		}
		return s
	}
	var q waitQueue
	q.add([]*endpoint{a, b}, 0)
	q.add([]*endpoint{a}, 5) // a higher one that can use a only (a subset hint)
	if got := addrs(q.usable(p, cands(), 0)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("priority 0 may use %v, want [b]: a is for the 5 waiting", got)
	}
	if got := addrs(q.usable(p, cands(), 5)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("priority 5 may use %v, want both", got)
	}
	q.add([]*endpoint{a}, 5)
	if q.remove([]*endpoint{a}, 5) {
		t.Fatal("another 5 still waits for a: the 0 must keep deferring, no wake-up")
	}
	if !q.remove([]*endpoint{a}, 5) {
		t.Fatal("the last 5 left a with the 0 waiting: it must look again")
	}
	if q.remove([]*endpoint{a, b}, 0) || q.n.Load() != 0 || len(q.by) != 0 {
		t.Fatalf("after everyone left: %d waiting, %v kept", q.n.Load(), q.by)
	}
}

// TestObjectivePriority: with the only endpoint at its limit, a request whose
// objective is sheddable (priority < 0) is refused at once with 429; of the
// requests waiting, the freed slot goes to the highest priority first,
// whatever their arrival order.
func TestObjectivePriority(t *testing.T) {
	clk := newClock()
	cfg := testConfig(schedulerSpec("p", llama, ep1))
	admission(cfg, 1, time.Minute)
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}, {Name: "bulk", Priority: 0}}
	g := newRouter(t, clk, cfg)
	ctx := context.Background()
	holder := pick(t, g, Request{Model: llama})

	start := time.Now()
	if _, ref := g.Current().Route(ctx, Request{Model: llama, Objective: "batch"}); ref == nil || ref.Status != http.StatusTooManyRequests || ref.RetryAfter == 0 {
		t.Fatalf("the sheddable request: %+v, want a 429 with Retry-After", ref)
	} else if took := time.Since(start); took > time.Second {
		t.Fatalf("the sheddable request waited %v before its 429", took)
	}
	if metric(t, g, "kvgate_shed_total", "reason", "sheddable") != 1 {
		t.Error("the sheddable refusal is not counted")
	}

	type picked struct {
		who string
		r   *Route
	}
	got := make(chan picked, 16)
	wait := func(who, objective string) {
		t.Helper()
		n := g.Waiting()
		go func() {
			r, ref := g.Current().Route(ctx, Request{Model: llama, Objective: objective})
			if ref != nil {
				t.Errorf("%s refused: %d %s", who, ref.Status, ref.Message)
			}
			got <- picked{who, r}
		}()
		waittest.Until(t, 5*time.Second, who+" waiting", func() bool { return g.Waiting() == n+1 })
	}
	// The holder ends; the next request to take the endpoint must be want.
	var order []string
	next := func(want string) {
		t.Helper()
		holder.Finish(Outcome{Status: http.StatusOK})
		select {
		case p := <-got:
			order = append(order, p.who)
			if p.r == nil || p.who != want {
				t.Fatalf("%s took the endpoint, want %s (order so far %v)", p.who, want, order)
			}
			holder = p.r
		case <-time.After(5 * time.Second):
			t.Fatalf("nobody took the freed endpoint, want %s", want)
		}
	}
	// A high-priority request waits first, then five of priority 0 (no
	// objective, one not configured, one of priority 0): the freed slot goes
	// to the high one whether the waiters are woken first-come or last-come.
	wait("high-1", "chat")
	for i := range 5 {
		wait("low", []string{"", "no-such-objective", "bulk"}[i%3])
	}
	next("high-1")
	// Another important request arrives while the five still wait: it too
	// goes first.
	wait("high-2", "chat")
	next("high-2")
	for range 5 {
		next("low")
	}
	holder.Finish(Outcome{Status: http.StatusOK})
	if n := g.Waiting(); n != 0 {
		t.Fatalf("%d still registered as waiting", n)
	}
}

// TestObjectivePrioritySubset: a higher-priority request waiting for an
// endpoint it alone may use (the proxy's subset hint) holds back nobody from
// the other endpoints — neither a priority-0 request nor a sheddable one, which
// takes the free endpoint rather than a 429.
func TestObjectivePrioritySubset(t *testing.T) {
	clk := newClock()
	cfg := testConfig(schedulerSpec("p", llama, ep1, ep2))
	admission(cfg, 1, 5*time.Second)
	cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 10}}
	g := newRouter(t, clk, cfg)
	timed := func(objective string, subset ...string) (*Route, time.Duration) {
		t.Helper()
		start := time.Now()
		return pick(t, g, Request{Model: llama, Objective: objective, Subset: subset}), time.Since(start)
	}
	holdA, _ := timed("", ep1)
	high := make(chan *Route, 1)
	go func() {
		r, ref := g.Current().Route(context.Background(), Request{Model: llama, Objective: "chat", Subset: []string{ep1}})
		if ref != nil {
			t.Errorf("the high-priority request was refused: %d %s", ref.Status, ref.Message)
		}
		high <- r
	}()
	waittest.Until(t, 5*time.Second, "the high-priority request waiting for ep1", func() bool { return g.Waiting() == 1 })

	for _, objective := range []string{"", "batch"} {
		r, took := timed(objective)
		if r.Served() != ep2 || took > time.Second {
			t.Fatalf("objective %q got %s after %v, want ep2 at once", objective, r.Served(), took)
		}
		r.Finish(Outcome{Status: http.StatusOK})
	}

	holdA.Finish(Outcome{Status: http.StatusOK})
	select {
	case r := <-high:
		if r == nil || r.Served() != ep1 {
			t.Fatalf("the high-priority request got %v, want ep1", r)
		}
		r.Finish(Outcome{Status: http.StatusOK})
	case <-time.After(5 * time.Second):
		t.Fatal("the high-priority request was not given ep1 when it freed")
	}
	if n := g.Waiting(); n != 0 {
		t.Fatalf("%d still registered as waiting", n)
	}
}

// TestSheddableAtSaturation: with no in-flight limit, a sheddable request is
// refused with 429 and Retry-After once every endpoint is past the
// saturation thresholds, while other requests are still routed; with one
// endpoint under them, it is routed too.
func TestSheddableAtSaturation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		second    engine.Metrics
		refused   bool
		sheddable int // kvgate_shed_total{reason="sheddable"} after
	}{
		{"every endpoint saturated", engine.Metrics{Waiting: 5, KVUsage: 0.3}, true, 1},
		{"one by its KV cache", engine.Metrics{Waiting: 0, KVUsage: 0.85}, true, 1},
		{"one endpoint under the thresholds", engine.Metrics{Waiting: 4, KVUsage: 0.3}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			cfg := testConfig(schedulerSpec("p", llama, ep1, ep2))
			cfg.Spec.Objectives = []v1alpha1.ObjectiveSpec{{Name: "batch", Priority: -1}}
			g := newRouter(t, clk, cfg)
			observe(g, clk, engine.Metrics{Waiting: 9, KVUsage: 0.5}, ep1)
			observe(g, clk, tc.second, ep2)
			ctx := context.Background()
			r, ref := g.Current().Route(ctx, Request{Model: llama, Objective: "batch"})
			if tc.refused != (ref != nil) {
				t.Fatalf("sheddable request: route %v, refusal %+v; want refused %v", r != nil, ref, tc.refused)
			}
			if ref != nil && (ref.Status != http.StatusTooManyRequests || ref.RetryAfter == 0) {
				t.Fatalf("refusal %+v, want 429 with Retry-After", ref)
			}
			if r != nil {
				r.Finish(Outcome{Status: http.StatusOK})
			}
			if got := metric(t, g, "kvgate_shed_total", "reason", "sheddable"); got != float64(tc.sheddable) {
				t.Errorf("kvgate_shed_total{reason=sheddable} = %v, want %d", got, tc.sheddable)
			}
			// An interactive request is routed whatever the saturation.
			pick(t, g, Request{Model: llama}).Finish(Outcome{Status: http.StatusOK})
		})
	}
}
