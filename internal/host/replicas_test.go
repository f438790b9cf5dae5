package host_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// The tests below run several gateway replicas over one simulated fleet,
// linked through a real Redis, as `kvgate serve --shared-state-redis` does.

// startReplicas starts n gateways over cfg sharing state through r ("" for
// none), and waits until each sees the others.
func startReplicas(t *testing.T, r *redistest.Server, n int, cfg *v1alpha1.InferenceGatewayConfig) []*servetest.Server {
	t.Helper()
	out := make([]*servetest.Server, n)
	for i := range out {
		out[i] = startReplica(t, r, fmt.Sprintf("r%d", i), cfg)
	}
	if r != nil {
		waittest.Until(t, 10*time.Second, "the replicas to find each other", func() bool {
			for _, rp := range out {
				if v := rp.Replicas(); v.Replicas != n || !v.Mesh.Up {
					return false
				}
			}
			return true
		})
	}
	return out
}

func startReplica(t *testing.T, r *redistest.Server, name string, cfg *v1alpha1.InferenceGatewayConfig) *servetest.Server {
	t.Helper()
	var core host.CoreOptions
	if r != nil {
		core.SharedState = host.SharedStateOptions{Redis: r.Addr(), Cluster: "test", Replica: name, Heartbeat: 100 * time.Millisecond}
	}
	return start(t, cfg, core)
}

// prefixed is a chat request whose 4 KB system prompt is the k-th of the
// test's and whose question is its own.
func prefixed(k, i int) string {
	system := fmt.Sprintf("Tenant %d. ", k) + strings.Repeat("You are a careful assistant for contract review; cite clauses. ", 64)
	return `{"model":"` + llama + `","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"question ` + fmt.Sprint(i) + `"}],"max_tokens":4}`
}

// streamed is a streaming chat request of about 2,000 prompt tokens, unique
// per i so that no prefix is shared.
func streamed(i int) string {
	content := fmt.Sprintf("Request %d. ", i) + strings.Repeat("Compare the two tenders line by line and list the differences. ", 125)
	return `{"model":"` + llama + `","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
}

// stream sends a chat request to base and reads its answer to the end, or
// until ctx ends.
func stream(ctx context.Context, base, body string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// hold sends n requests straight to the model server at addr, past the
// gateway; they run until the test ends.
func hold(t *testing.T, addr string, n int, body string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		wg.Go(func() { stream(ctx, "http://"+addr, body) })
	}
}

// threeSims starts three like simulated servers.
func threeSims(t *testing.T) []string {
	t.Helper()
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}}).Addr()
	}
	return addrs
}

// TestReplicasSharePrefixes: a system prompt first routed by one replica goes
// to the same pod when its next request arrives at another; a replica started
// afterwards routes it there on its first request (it replayed the decisions).
// Without shared state the second replica knows nothing of it: eight prompts
// would all land on their pods by chance one time in 3^8.
func TestReplicasSharePrefixes(t *testing.T) {
	r := redistest.Start(t)
	cfg := config(scheduler("p", llama, threeSims(t)...))
	rs := startReplicas(t, r, 2, cfg)
	first := map[int]string{}
	for k := range 8 {
		first[k] = post(t, rs[0].URL, prefixed(k, 0))
	}
	waittest.Until(t, 5*time.Second, "the decisions to reach the second replica", func() bool {
		return rs[1].Replicas().Mesh.Counters["received"] > 0
	})
	time.Sleep(50 * time.Millisecond) // a few flushes for the last ones
	for k := range 8 {
		if got := post(t, rs[1].URL, prefixed(k, 1)); got != first[k] {
			t.Errorf("prompt %d: replica 0 sent it to %s, replica 1 to %s", k, first[k], got)
		}
	}
	late := startReplica(t, r, "late", cfg)
	waittest.Until(t, 5*time.Second, "the late replica to replay", func() bool {
		n := 0
		for _, e := range late.Router().FleetView()[0].Endpoints {
			n += e.PrefixBlocks
		}
		return n > 0
	})
	for k := range 8 {
		if got := post(t, late.URL, prefixed(k, 2)); got != first[k] {
			t.Errorf("prompt %d at a replica started afterwards: went to %s, not %s", k, got, first[k])
		}
	}
}

// TestReplicasShareInFlightLimit: with maxInFlightPerEndpoint 4 and three
// replicas, each may always use its part (2, 1, 1) and borrows what the
// others' last reports leave free, once its view has settled. All the
// traffic through the replica whose part is 1 is answered, with never more
// than 4 at the pod; a burst spread over the three exceeds 4 at the pod by at
// most the borrows not yet in the others' views, one a replica
// (docs/scaling.md). Every request ends in 200.
func TestReplicasShareInFlightLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		through func(i int) int // the replica of request i
		most    int64
	}{
		{"all through one replica", func(int) int { return 1 }, 4},
		{"spread over the three", func(i int) int { return i % 3 }, 4 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			s := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "a10g", ModelSize: "8b"}})
			cfg := config(scheduler("p", llama, s.Addr()))
			limit := int32(4)
			cfg.Spec.Gateway.MaxInFlightPerEndpoint = &limit
			cfg.Spec.Gateway.QueueTimeout = &metav1.Duration{Duration: 10 * time.Second}
			rs := startReplicas(t, r, 3, cfg)
			if p := rs[1].Replicas().InFlightPart; p != 1 {
				t.Fatalf("replica 1's part of the limit is %d, want 1", p)
			}
			var most atomic.Int64
			stop := make(chan struct{})
			var watch sync.WaitGroup
			watch.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					if n := int64(s.InSystem()); n > most.Load() {
						most.Store(n)
					}
				}
			})
			var wg sync.WaitGroup
			var ok atomic.Int64
			body := `{"model":"` + llama + `","messages":[{"role":"user","content":"` + strings.Repeat("Summarise the filing. ", 100) + `"}],"max_tokens":24}`
			for i := range 24 {
				wg.Go(func() {
					resp, err := http.Post(rs[tc.through(i)].URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						ok.Add(1)
					} else {
						t.Errorf("status %d", resp.StatusCode)
					}
				})
			}
			wg.Wait()
			close(stop)
			watch.Wait()
			t.Logf("at most %d at the pod; %d of 24 answered", most.Load(), ok.Load())
			if most.Load() > tc.most {
				t.Errorf("the pod held %d requests at once, over %d", most.Load(), tc.most)
			}
			if most.Load() < 3 {
				t.Errorf("the pod never held more than %d: the replicas did not borrow each other's parts", most.Load())
			}
		})
	}
}

// TestReplicasRedisDies: killing Redis mid-run fails no request on any
// replica; once it is back, a prompt routed by one replica is known to the
// other again.
func TestReplicasRedisDies(t *testing.T) {
	r := redistest.Start(t)
	cfg := config(scheduler("p", llama, threeSims(t)...))
	rs := startReplicas(t, r, 2, cfg)
	stop := traffic(t, []string{rs[0].URL, rs[1].URL}, 100)
	time.Sleep(300 * time.Millisecond)
	r.Kill()
	waittest.Until(t, 5*time.Second, "the replicas to see Redis down", func() bool {
		return !rs[0].Replicas().Mesh.Up && !rs[1].Replicas().Mesh.Up
	})
	time.Sleep(500 * time.Millisecond)
	r.Restart(t)
	waittest.Until(t, 10*time.Second, "the replicas to reconnect", func() bool {
		return rs[0].Replicas().Mesh.Up && rs[1].Replicas().Mesh.Up
	})
	t.Logf("%d requests answered across Redis's death and return", stop())
	sharesPrompts(t, rs[0], rs[1], 200)
}

// traffic runs four closed-loop clients over bases (prompt groups from
// first on), each failure reported by post; stop ends them and returns how
// many requests were answered.
func traffic(t *testing.T, bases []string, first int) (stop func() int64) {
	t.Helper()
	var wg sync.WaitGroup
	done := make(chan struct{})
	var answered atomic.Int64
	for c := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if post(t, bases[c%len(bases)], prefixed(first+c, i)) == "" {
					return
				}
				answered.Add(1)
			}
		})
	}
	stop = sync.OnceValue(func() int64 { close(done); wg.Wait(); return answered.Load() })
	t.Cleanup(func() { stop() })
	return stop
}

// sharesPrompts routes six new system prompts through one replica and checks
// that the other sends each to the same pod.
func sharesPrompts(t *testing.T, from, to *servetest.Server, base int) {
	t.Helper()
	first := map[int]string{}
	before := to.Replicas().Mesh.Counters["received"]
	for k := base; k < base+6; k++ {
		first[k] = post(t, from.URL, prefixed(k, 0))
	}
	waittest.Until(t, 5*time.Second, "the decisions to reach the other replica", func() bool {
		return to.Replicas().Mesh.Counters["received"] > before
	})
	time.Sleep(50 * time.Millisecond) // a few flushes for the last ones
	for k := base; k < base+6; k++ {
		if got := post(t, to.URL, prefixed(k, 1)); got != first[k] {
			t.Errorf("prompt %d: one replica sent it to %s, the other to %s", k, first[k], got)
		}
	}
}

// TestReplicasShareScraping: three replicas scrape each model server about as
// often as one replica does (each endpoint has one scraper, which publishes
// the result), not three times; when one replica is closed mid-run the others
// answer every request and its endpoints keep being scraped.
func TestReplicasShareScraping(t *testing.T) {
	r := redistest.Start(t)
	servers := make([]*simserver.Server, 3)
	addrs := make([]string, 3)
	for i := range servers {
		servers[i] = startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
		addrs[i] = servers[i].Addr()
	}
	cfg := config(scheduler("p", llama, addrs...))
	rate := func(window time.Duration) []float64 {
		before := make([]int64, len(servers))
		for i, s := range servers {
			before[i] = s.Scrapes()
		}
		time.Sleep(window)
		out := make([]float64, len(servers))
		for i, s := range servers {
			out[i] = float64(s.Scrapes()-before[i]) / window.Seconds()
		}
		return out
	}
	rs := startReplicas(t, r, 3, cfg)
	time.Sleep(300 * time.Millisecond) // past the first scrapes, which every replica makes
	shared := rate(2 * time.Second)
	t.Logf("scrapes per second at each server, 3 replicas sharing: %.1f", shared)
	for i, v := range shared {
		// One replica scrapes every 50 ms (±10%): about 20 a second.
		if v > 30 {
			t.Errorf("server %d scraped %.1f times a second by three replicas sharing (one replica: about 20)", i, v)
		}
	}
	stop := traffic(t, []string{rs[1].URL, rs[2].URL}, 300)
	time.Sleep(200 * time.Millisecond)
	rs[0].Close()
	// The others take its share over: within three one-second windows, one
	// where every server is scraped at least half as often as one replica
	// alone scrapes it (a busy machine stretches the first window, which
	// the handover straddles).
	var after []float64
	for range 3 {
		if after = rate(time.Second); slices.Min(after) >= 10 {
			break
		}
	}
	t.Logf("after one replica left: %.1f scrapes a second; %d requests answered by the others", after, stop())
	for i, v := range after {
		if v < 10 {
			t.Errorf("server %d scraped %.1f times a second three seconds after a replica left", i, v)
		}
	}
	for _, e := range rs[1].Router().FleetView()[0].Endpoints {
		if !e.Healthy || e.Stale {
			t.Errorf("endpoint %s unhealthy or stale after a replica left: %+v", e.Address, e)
		}
	}
}

// TestReplicasBurstDoesNotHerd: three pods, two with 20 requests queued at
// the last scrape and one idle, take a burst of 198 requests spread over three
// replicas inside one scrape interval (50 ms), with the gie-default profile
// (whose scores follow the scraped queue and KV cache, and the gateway's own
// dispatches on top). One replica fills the idle pod up to the others' queue,
// about 20, then spreads the rest (80 of 198); three replicas that share
// nothing each fill it with their own 20 first (107). Sharing the dispatches
// keeps it at one replica's figure. (The default chat profile
// also scores each pod's queued prefill, which spreads a burst within a
// replica before the queues level.)
func TestReplicasBurstDoesNotHerd(t *testing.T) {
	const burstSize = 198 // 66 a replica
	for _, tc := range []struct {
		name            string
		replicas        int
		shared          bool
		atLeast, atMost int
	}{{"one replica", 1, false, 70, 90}, {"shared", 3, true, 70, 92}, {"not shared", 3, false, 100, burstSize}} {
		t.Run(tc.name, func(t *testing.T) {
			var r *redistest.Server
			if tc.shared {
				r = redistest.Start(t)
			}
			addrs := make([]string, 3)
			servers := make([]*simserver.Server, 3)
			for i := range addrs {
				servers[i] = startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 2}})
				addrs[i] = servers[i].Addr()
			}
			long := `{"model":"` + llama + `","messages":[{"role":"user","content":"Write on."}],"max_tokens":4000,"ignore_eos":true}`
			for _, a := range addrs[1:] {
				hold(t, a, 22, long)
			}
			waittest.Until(t, 10*time.Second, "the busy pods to queue", func() bool {
				return servers[1].Waiting() == 20 && servers[2].Waiting() == 20
			})
			cfg := config(scheduler("p", llama, addrs...))
			// One scrape, read for the whole test: the burst is decided on it.
			cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{Interval: &metav1.Duration{Duration: 30 * time.Second}, StaleAfter: &metav1.Duration{Duration: 10 * time.Minute}}
			cfg.Spec.Schedulers[0].Profile = "gie-default"
			depth := int32(1000) // the queues decide by score, not by the saturation filter
			cfg.Spec.Schedulers[0].Saturation = &v1alpha1.SaturationSpec{QueueDepth: &depth}
			rs := startReplicas(t, r, tc.replicas, cfg)
			waittest.Until(t, 10*time.Second, "every replica's first scrape", func() bool {
				for _, rp := range rs {
					for _, e := range rp.Router().FleetView()[0].Endpoints {
						if !e.Scraped {
							return false
						}
					}
				}
				return true
			})
			// The picks are read off the replicas' in-flight counts: a queued
			// request's answer would take minutes to start.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			// The burst arrives over 50 ms: inside one scrape interval at the
			// default rate, longer than the propagation (about 3 ms).
			for i := range burstSize {
				time.Sleep(50 * time.Millisecond / burstSize)
				wg.Go(func() {
					body := `{"model":"` + llama + `","messages":[{"role":"user","content":"Case ` + fmt.Sprint(i) + `."}],"max_tokens":4000,"ignore_eos":true,"stream":true}`
					stream(ctx, rs[i%len(rs)].URL, body)
				})
			}
			served := map[string]int{}
			waittest.Until(t, 20*time.Second, "the whole burst picked", func() bool {
				clear(served)
				n := 0
				for _, rp := range rs {
					for _, e := range rp.Router().FleetView()[0].Endpoints {
						served[e.Address] += int(e.InFlight)
						n += int(e.InFlight)
					}
				}
				return n == burstSize
			})
			idle := served[addrs[0]]
			t.Logf("the idle pod took %d of %d (busy pods %d and %d)", idle, burstSize, served[addrs[1]], served[addrs[2]])
			if idle < tc.atLeast || idle > tc.atMost {
				t.Errorf("the idle pod took %d of %d, want %d to %d", idle, burstSize, tc.atLeast, tc.atMost)
			}
		})
	}
}

// TestReplicasShareEjections: a pod that fails fast, ejected by the replica
// that saw its failures, is ejected by its peer too, which then sends it
// nothing though it never saw it fail.
func TestReplicasShareEjections(t *testing.T) {
	r := redistest.Start(t)
	bad := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	badAddr := bad.Addr()
	good := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}}).Addr()
	cfg := config(scheduler("p", llama, badAddr, good))
	cfg.Spec.Schedulers[0].Profile = "gie-default" // no errorRate scorer to steer off the failing pod first
	three := int32(3)
	cfg.Spec.Gateway.OutlierDetection = &v1alpha1.OutlierSpec{ConsecutiveFailures: &three}
	rs := startReplicas(t, r, 2, cfg)
	if err := bad.SetFaults(simserver.Faults{ErrorRate: 1, ErrorStatus: http.StatusInternalServerError}); err != nil {
		t.Fatal(err)
	}
	ejected := func(g *servetest.Server) bool {
		for _, e := range g.Router().FleetView()[0].Endpoints {
			if e.Address == badAddr {
				return e.EjectedForMs > 0
			}
		}
		return false
	}
	waittest.Until(t, 10*time.Second, "the first replica to eject the failing pod", func() bool {
		post(t, rs[0].URL, streamed(int(time.Now().UnixNano()%1e6))) // retried to the good pod
		return ejected(rs[0])
	})
	waittest.Until(t, 5*time.Second, "its peer to eject it too", func() bool { return ejected(rs[1]) })
	for i := range 10 {
		if got := post(t, rs[1].URL, streamed(i)); got != good {
			t.Fatalf("the peer sent a request to %s, not the healthy pod", got)
		}
	}
}

// TestSharedStateMisconfigured: a shared state that cannot be used (its CA
// file missing) leaves the replica routing alone and says so in
// kvgate_replica_shared_state_up; a later configuration that fixes it links
// the replica.
func TestSharedStateMisconfigured(t *testing.T) {
	r := redistest.Start(t)
	addr := startSim(t, llama, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}}).Addr()
	cfg := config(scheduler("p", llama, addr))
	cfg.Spec.Gateway.SharedState = &v1alpha1.SharedStateSpec{Redis: r.Addr(), TLS: &v1alpha1.SharedStateTLS{CAFile: "/nonexistent/ca.crt"}}
	g := start(t, cfg, host.CoreOptions{})
	if v := g.Replicas(); v.Shared {
		t.Fatalf("linked with an unusable shared state: %+v", v)
	}
	if got := gaugeValue(t, g, "kvgate_replica_shared_state_up"); got != 0 {
		t.Fatalf("kvgate_replica_shared_state_up %v, want 0", got)
	}
	post(t, g.URL, streamed(1)) // routing goes on
	fixed := cfg.DeepCopy()
	fixed.Spec.Gateway.SharedState.TLS = nil
	if err := g.Apply(fixed); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "the replica to link", func() bool { v := g.Replicas(); return v.Shared && v.Mesh.Up })
	if got := gaugeValue(t, g, "kvgate_replica_shared_state_up"); got != 1 {
		t.Fatalf("kvgate_replica_shared_state_up %v once linked, want 1", got)
	}
}

// gaugeValue reads an unlabelled gauge from the gateway's registry.
func gaugeValue(t *testing.T, g *servetest.Server, name string) float64 {
	t.Helper()
	mfs, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
