package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
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
func TestPeerSyncDelivers(t *testing.T) {
	const delay, every = 3 * time.Millisecond, 2 * time.Millisecond
	_, tr := sharedPrefixTrace(t, 10)
	addrs := []string{"sim-0:8000", "sim-1:8000"}
	byAddr := map[string]int{addrs[0]: 0, addrs[1]: 1}
	cfg, err := simConfig(SimOptions{Policy: "chat"}, tr, addrs)
	if err != nil {
		t.Fatal(err)
	}
	var now time.Duration
	reps, err := newReplicas(SimOptions{Policy: "chat", ScrapeInterval: 50 * time.Millisecond, StaleAfter: 2 * time.Second}, cfg, 2, true,
		func() time.Time { return epoch.Add(now) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, r := range reps {
			r.router.Close()
		}
	}()
	m := engine.Metrics{NumBlocks: 1000, BlockSize: blockTokens}
	for _, r := range reps {
		for _, a := range addrs {
			r.router.Observe(a, m, engine.VLLM, epoch)
		}
	}
	p := newPeerSync(reps, addrs, byAddr, delay, every, time.Hour, func() time.Duration { return now })
	text := blockText(nil, workload.BlockIDs(nil, tr[0].Prompt, blockTokens)[:8])
	step := func(to time.Duration) {
		for {
			at, ok := p.due()
			if !ok || at > to {
				break
			}
			now = at
			p.tick(at)
		}
		now = to
	}
	// Replica 0 routes a request at 1 ms.
	step(time.Millisecond)
	rt, ref := reps[0].router.Route(context.Background(), route.Request{Model: tr[0].Model, Prompt: text, BodyBytes: 4000, Start: epoch.Add(now)})
	if ref != nil {
		t.Fatal(ref.Message)
	}
	ep := byAddr[rt.Endpoints[0]]
	pending := func(k int) int { return reps[k].router.Snapshot(addrs[ep : ep+1])[0].Pending }
	step(time.Millisecond + delay - time.Microsecond)
	if n := prefixBlocks(reps[1].router, rt.Endpoints[0]); n != 0 || pending(1) != 0 {
		t.Fatalf("before the delay: the peer holds %d blocks and %d pending", n, pending(1))
	}
	// The decision is due at 4 ms; the load, published at 2 ms, at 5 ms.
	step(time.Millisecond + delay)
	if n := prefixBlocks(reps[1].router, rt.Endpoints[0]); n != 8 || pending(1) != 0 {
		t.Fatalf("after the delay: the peer holds %d blocks, want 8, and %d pending before the load's publication arrives", n, pending(1))
	}
	step(every + delay)
	if pending(1) != 1 || pending(0) != 1 {
		t.Fatalf("pending: the peer reads %d, the sender %d; want 1 and 1", pending(1), pending(0))
	}
	// The request ends at 6 ms: the peer reads the endpoint free once the
	// publication at 6 ms arrives.
	step(6 * time.Millisecond)
	rt.Finish(route.Outcome{Status: 200})
	step(8*time.Millisecond + delay)
	if pending(1) != 0 {
		t.Fatalf("after the finish: the peer reads %d pending", pending(1))
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
