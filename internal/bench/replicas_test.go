package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/workload"
)

// sharedPrefixTrace is the aws suite's shared-prefix scenario cut to n
// requests.
func sharedPrefixTrace(t *testing.T, n int) (Scenario, workload.Trace) {
	t.Helper()
	s, _ := quickScenario(t, "shared-prefix")
	s.Workload.Requests = n
	tr, err := workload.Generate(s.Workload)
	if err != nil {
		t.Fatal(err)
	}
	return s, tr
}

func simulated(t *testing.T, opts SimOptions, tr workload.Trace) simOutput {
	t.Helper()
	out, err := simulate(context.Background(), opts, tr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// One replica, shared or not, is the single-replica bench: the same records,
// the same servers, whatever the sharing's settings.
func TestOneReplicaIsTheSingleRun(t *testing.T) {
	s, tr := sharedPrefixTrace(t, 200)
	// run returns a run's records and the server of each request.
	run := func(opts SimOptions) ([]report.Record, []int) {
		var servers []int
		opts.probe = func(s []int) { servers = slices.Clone(s) }
		return simulated(t, opts, tr).recs, servers
	}
	for _, policy := range []string{"chat", "least-request"} {
		base := SimOptions{Fleet: s.Fleet, Policy: policy, Seed: 1}
		wantRecs, want := run(base)
		for _, c := range []struct {
			name string
			opts func(*SimOptions)
		}{
			{"one replica", func(o *SimOptions) { o.Replicas = 1 }},
			{"one replica, shared", func(o *SimOptions) {
				o.Replicas, o.Shared, o.SyncDelay, o.SyncEvery = 1, true, time.Millisecond, time.Millisecond
			}},
			{"one replica, shared at once", func(o *SimOptions) { o.Replicas, o.Shared = 1, true }},
		} {
			t.Run(policy+"/"+c.name, func(t *testing.T) {
				opts := base
				c.opts(&opts)
				recs, servers := run(opts)
				if !slices.Equal(servers, want) || !slices.Equal(recs, wantRecs) {
					t.Fatalf("servers or records differ from the single run's")
				}
			})
		}
	}
}

// At 8 replicas, shared state keeps shared-prefix's hit rate near one
// replica's; unshared, each replica's index knows an eighth of where the
// system prompts went and the hit rate falls. A delay longer than the trace
// delivers nothing before the last decision: the run is the unshared one.
func TestSharingKeepsHitRate(t *testing.T) {
	s, tr := sharedPrefixTrace(t, 600)
	var ownRecs, lateRecs []report.Record
	run := func(replicas int, shared bool, delay time.Duration, recs *[]report.Record) report.Result {
		out := simulated(t, SimOptions{Fleet: s.Fleet, Policy: "chat", Replicas: replicas, Shared: shared, SyncDelay: delay, SyncEvery: DefaultSyncEvery}, tr)
		if recs != nil {
			*recs = out.recs
		}
		return report.Summarize(s.Name, "chat", "sim", out.recs)
	}
	one, own := run(1, false, 0, nil), run(8, false, 0, &ownRecs)
	shared, late := run(8, true, DefaultSyncDelay, nil), run(8, true, time.Hour, &lateRecs)
	t.Logf("hit rate: one replica %.3f, 8 unshared %.3f, 8 shared %.3f, 8 shared an hour late %.3f",
		one.PrefixHitRate, own.PrefixHitRate, shared.PrefixHitRate, late.PrefixHitRate)
	if shared.PrefixHitRate < 0.95*one.PrefixHitRate || shared.PrefixHitRate < own.PrefixHitRate+0.05 {
		t.Errorf("shared hit rate %.3f: want at least 0.95× one replica's %.3f and above the unshared %.3f",
			shared.PrefixHitRate, one.PrefixHitRate, own.PrefixHitRate)
	}
	if own.PrefixHitRate > 0.9*one.PrefixHitRate {
		t.Errorf("unshared hit rate %.3f: want it below 0.9× one replica's %.3f", own.PrefixHitRate, one.PrefixHitRate)
	}
	if !slices.Equal(lateRecs, ownRecs) {
		t.Errorf("shared an hour late: hit rate %.3f, P95 %.1f ms; want the unshared run's records", late.PrefixHitRate, late.TTFTP95ms)
	}
}

// A client's requests go to one replica; requests without a client spread
// evenly at random; the seed alone decides.
func TestSpreadOver(t *testing.T) {
	var tr workload.Trace
	for i := range 4000 {
		q := workload.Request{}
		if i%2 == 0 {
			q.Session = fmt.Sprint("user-", i%100)
		}
		tr = append(tr, q)
	}
	for _, n := range []int{1, 2, 8} {
		got := spreadOver(tr, n, 7)
		if again := spreadOver(tr, n, 7); !slices.Equal(got, again) {
			t.Fatalf("%d replicas: not deterministic", n)
		}
		of := map[string]int32{}
		per := make([]int, n)
		for i, q := range tr {
			if q.Session == "" {
				per[got[i]]++
				continue
			}
			if k, ok := of[q.Session]; ok && k != got[i] {
				t.Fatalf("%d replicas: %s on replicas %d and %d", n, q.Session, k, got[i])
			}
			of[q.Session] = got[i]
		}
		for k, c := range per {
			if want := 2000 / n; c < want*8/10 || c > want*12/10 {
				t.Errorf("%d replicas: replica %d got %d of 2000 requests without a client", n, k, c)
			}
		}
	}
	if slices.Equal(spreadOver(tr, 8, 7), spreadOver(tr, 8, 8)) {
		t.Error("another seed, the same spread")
	}
}

// What one replica decides and dispatches reaches the other's prefix index
// and load the sync delay later, not before, and never the sender's own
// view twice.
// syncRig is two shared replicas over two endpoints, linked by a peerSync
// on a clock the test steps.
type syncRig struct {
	t      *testing.T
	tr     workload.Trace
	addrs  []string
	byAddr map[string]int
	reps   []*replica
	p      *peerSync
	now    time.Duration
}

func newSyncRig(t *testing.T, delay, every time.Duration) *syncRig {
	_, tr := sharedPrefixTrace(t, 10)
	g := &syncRig{t: t, tr: tr, addrs: []string{"sim-0:8000", "sim-1:8000"}}
	g.byAddr = map[string]int{g.addrs[0]: 0, g.addrs[1]: 1}
	cfg, err := simConfig(SimOptions{Policy: "chat"}, tr, g.addrs)
	if err != nil {
		t.Fatal(err)
	}
	g.reps, err = newReplicas(SimOptions{Policy: "chat", ScrapeInterval: 50 * time.Millisecond, StaleAfter: 2 * time.Second}, cfg, 2, true,
		func() time.Time { return epoch.Add(g.now) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range g.reps {
			r.router.Close()
		}
	})
	m := engine.Metrics{NumBlocks: 1000, BlockSize: blockTokens}
	for _, r := range g.reps {
		for _, a := range g.addrs {
			r.router.Observe(a, m, engine.VLLM, epoch)
		}
	}
	g.p = newPeerSync(g.reps, g.addrs, g.byAddr, delay, every, time.Hour, func() time.Duration { return g.now })
	return g
}

// step runs what falls due up to to.
func (g *syncRig) step(to time.Duration) {
	for {
		at, ok := g.p.due()
		if !ok || at > to {
			break
		}
		g.now = at
		g.p.tick(at)
	}
	g.now = to
}

// route has replica k route trace request i now.
func (g *syncRig) route(k, i int) *route.Route {
	text := blockText(nil, workload.BlockIDs(nil, g.tr[i].Prompt, blockTokens)[:8])
	rt, ref := g.reps[k].router.Route(context.Background(), route.Request{Model: g.tr[i].Model, Prompt: text, BodyBytes: 4000, Start: epoch.Add(g.now)})
	if ref != nil {
		g.t.Fatal(ref.Message)
	}
	return rt
}

// pending is the requests replica k counts on the endpoint at addr.
func (g *syncRig) pending(k int, addr string) int {
	return g.reps[k].router.Snapshot([]string{addr})[0].Pending
}

func TestPeerSyncDelivers(t *testing.T) {
	const delay, every = 3 * time.Millisecond, 2 * time.Millisecond
	g := newSyncRig(t, delay, every)
	// Replica 0 routes a request at 1 ms.
	g.step(time.Millisecond)
	rt := g.route(0, 0)
	addr := rt.Endpoints[0]
	pending := func(k int) int { return g.pending(k, addr) }
	g.step(time.Millisecond + delay - time.Microsecond)
	if n := prefixBlocks(g.reps[1].router, addr); n != 0 || pending(1) != 0 {
		t.Fatalf("before the delay: the peer holds %d blocks and %d pending", n, pending(1))
	}
	// The decision is due at 4 ms; the load, published at 2 ms, at 5 ms.
	g.step(time.Millisecond + delay)
	if n := prefixBlocks(g.reps[1].router, addr); n != 8 || pending(1) != 0 {
		t.Fatalf("after the delay: the peer holds %d blocks, want 8, and %d pending before the load's publication arrives", n, pending(1))
	}
	g.step(every + delay)
	if pending(1) != 1 || pending(0) != 1 {
		t.Fatalf("pending: the peer reads %d, the sender %d; want 1 and 1", pending(1), pending(0))
	}
	// The request ends at 6 ms: the peer reads the endpoint free once the
	// publication at 6 ms arrives.
	g.step(6 * time.Millisecond)
	rt.Finish(route.Outcome{Status: 200})
	g.step(8*time.Millisecond + delay)
	if pending(1) != 0 {
		t.Fatalf("after the finish: the peer reads %d pending", pending(1))
	}
}

// Sending at each change, a replica gathers what changes within
// peers.DefaultFlush of its last send, as the mesh does: the first change
// after a quiet spell goes at once, the next waits for the flush.
func TestPeerSyncGathers(t *testing.T) {
	const delay = 500 * time.Microsecond
	g := newSyncRig(t, delay, 0)
	total := func(k int) int { return g.pending(k, g.addrs[0]) + g.pending(k, g.addrs[1]) }
	g.step(10 * time.Millisecond)
	g.route(0, 0)
	g.step(10*time.Millisecond + delay)
	if n := total(1); n != 1 {
		t.Fatalf("the first change after a quiet spell: the peer reads %d pending %v after it, want 1", n, delay)
	}
	// A second request 1 ms later, within the flush of the first send:
	// it goes with the send at 12 ms.
	g.step(11 * time.Millisecond)
	g.route(0, 1)
	sent := 10*time.Millisecond + peers.DefaultFlush
	g.step(sent + delay - time.Microsecond)
	if n := total(1); n != 1 {
		t.Fatalf("before the gathered send arrives: the peer reads %d pending, want 1", n)
	}
	g.step(sent + delay)
	if n, own := total(1), total(0); n != 2 || own != 2 {
		t.Fatalf("once it arrives: the peer reads %d pending, the sender %d; want 2 and 2", n, own)
	}
}

// prefixBlocks is how many prompt blocks r's prefix index holds for addr.
func prefixBlocks(r *route.Router, addr string) int {
	for _, v := range r.FleetView() {
		for _, e := range v.Endpoints {
			if e.Address == addr {
				return e.PrefixBlocks
			}
		}
	}
	return 0
}

// A bench-side policy has no gateway to replicate, and a sharing delay is
// never negative.
func TestReplicasRefused(t *testing.T) {
	s, tr := sharedPrefixTrace(t, 10)
	for _, opts := range []SimOptions{{Policy: Oracle, Replicas: 2}, {Policy: KubeProxy, Replicas: 2}, {Policy: "chat", Replicas: 2, Shared: true, SyncDelay: -1}} {
		opts.Fleet = s.Fleet
		if _, err := simulate(context.Background(), opts, tr); err == nil {
			t.Errorf("%s behind %d replicas, delay %v: no error", opts.Policy, opts.Replicas, opts.SyncDelay)
		}
	}
}
