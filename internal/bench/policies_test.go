package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// chatTrace is n chat requests of ~prompt tokens and out output tokens,
// arriving every gap: a small, hand-built trace.
func chatTrace(n int, gap time.Duration, prompt, out int) workload.Trace {
	var tr workload.Trace
	for i := range n {
		p := prompt + (i*37)%(prompt/2+1) // lengths vary a little
		tr = append(tr, workload.Request{At: float64(i) * gap.Seconds(), Model: llama8b,
			Prompt: []workload.Segment{{ID: fmt.Sprint("u", i), Tokens: p}}, OutputTokens: out})
	}
	return tr
}

func h100s(n int) simserver.FleetSpec {
	return simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, n, nil)}}
}

// Within a draw every request of one client goes to one pod (the pod its
// connection drew); different draws pin differently; IPVS gives the clients'
// connections pods in turn, so every pod holds the same number of clients.
func TestKubeProxyPinning(t *testing.T) {
	const pods, draws = 4, 5
	tr := chatTrace(400, 20*time.Millisecond, 200, 16)
	for _, tc := range []struct {
		policy  string
		clients int
	}{
		{KubeProxy, 0}, {KubeProxyIPVS, 0}, {KubeProxy, 6}, {KubeProxyIPVS, 6},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.policy, tc.clients), func(t *testing.T) {
			c := tc.clients
			if c == 0 {
				c = 4 * pods
			}
			client := clientsOf(len(tr), c, 1)
			var pinnings [][]int
			for d := range draws {
				got := simProbe(t, SimOptions{Fleet: h100s(pods), Policy: tc.policy, Seed: 1, Clients: tc.clients, Draw: d}, tr)
				pin := slices.Repeat([]int{-1}, c)
				for req, pod := range got {
					cl := client[req]
					if pin[cl] >= 0 && pin[cl] != pod {
						t.Fatalf("draw %d: client %d's requests went to pods %d and %d", d, cl, pin[cl], pod)
					}
					pin[cl] = pod
				}
				if slices.Contains(pin, -1) {
					t.Fatalf("draw %d: a client sent no request in %d (assignment %v)", d, len(tr), pin)
				}
				if tc.policy == KubeProxyIPVS {
					per := make([]int, pods)
					for _, p := range pin {
						per[p]++
					}
					for p, n := range per {
						if n < c/pods || n > (c+pods-1)/pods {
							t.Fatalf("draw %d: ipvs gave pod %d %d of %d connections: %v", d, p, n, c, per)
						}
					}
				}
				for e, prev := range pinnings {
					if slices.Equal(prev, pin) {
						t.Fatalf("draws %d and %d pinned the clients alike: %v", e, d, pin)
					}
				}
				pinnings = append(pinnings, pin)
			}
		})
	}
}

// IPVS's rr scheduler: the k-th connection to open goes to pod k mod n.
func TestIPVSRoundRobinInOpenOrder(t *testing.T) {
	for _, c := range []int{4, 7, 16} {
		pod := connections(KubeProxyIPVS, c, 3, 9, 2)
		// Recover the opening order the draw used, and check the turns.
		order := drawRand(9, 2).Perm(c)
		for k, client := range order {
			if pod[client] != k%3 {
				t.Fatalf("%d clients: connection %d (client %d) went to pod %d, want %d", c, k, client, pod[client], k%3)
			}
		}
	}
}

// Smooth weighted round-robin splits by the weights, exactly over a whole
// cycle, and interleaves rather than sending runs.
func TestSmoothWRR(t *testing.T) {
	for _, tc := range []struct {
		weights []float64
		picks   int
		want    []int
	}{
		{[]float64{1, 1, 1}, 300, []int{100, 100, 100}},
		{[]float64{3, 1, 2}, 600, []int{300, 100, 200}},
		{[]float64{31.5, 31.5, 1.7, 1.7}, 662, []int{315, 315, 16, 16}},
		{[]float64{5, 1}, 12, []int{10, 2}},
	} {
		s := newSmoothWRR(tc.weights)
		got := make([]int, len(tc.weights))
		run, longest := 0, 0
		last := -1
		for range tc.picks {
			i := s.next()
			got[i]++
			if i == last {
				run++
			} else {
				run = 1
			}
			last = i
			longest = max(longest, run)
		}
		for i := range got {
			if math.Abs(float64(got[i]-tc.want[i])) > 1 {
				t.Errorf("weights %v: %v picks, want %v", tc.weights, got, tc.want)
				break
			}
		}
		// The smooth variant interleaves: with weights 5 and 1 the heavy server
		// never gets the whole cycle of 6 in a row, as plain weighted
		// round-robin would give it.
		if slices.Equal(tc.weights, []float64{5, 1}) && longest >= 6 {
			t.Errorf("weights %v: a run of %d picks of one server", tc.weights, longest)
		}
	}
}

// weighted-round-robin, over a long trace on a mixed fleet, sends each server
// its capacity's share; the capacities are those the suite quotes (H100 ~31.5
// requests/s, A10G ~1.7 at P95 TTFT < 2 s) to within 25%.
func TestWeightedRoundRobinSplitsByCapacity(t *testing.T) {
	s, tr := quickScenario(t, "mixed-gpu")
	w, err := (&simRun{engines: newEngines(t, s.Fleet)}).capacities(simArrivals(tr))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{31.5, 31.5, 31.5, 31.5, 1.7, 1.7, 1.7, 1.7} {
		if math.Abs(w[i]-want)/want > 0.25 {
			t.Errorf("server %d: capacity %.2f requests/s, suite quotes %.1f", i, w[i], want)
		}
	}
	got := simProbe(t, SimOptions{Fleet: s.Fleet, Policy: WeightedRoundRobin, Seed: 1}, tr)
	per := make([]int, len(w))
	for _, i := range got {
		per[i]++
	}
	var total float64
	for _, x := range w {
		total += x
	}
	for i := range per {
		want := float64(len(tr)) * w[i] / total
		if math.Abs(float64(per[i])-want) > 1 {
			t.Errorf("server %d (weight %.2f): %d of %d requests, want %.1f", i, w[i], per[i], len(tr), want)
		}
	}
}

// Every policy is described, round-robin as the ideal it is.
func TestPolicyDescriptions(t *testing.T) {
	for _, p := range Policies {
		if PolicyDescriptions[p] == "" {
			t.Errorf("policy %q has no description", p)
		}
	}
	if len(PolicyDescriptions) != len(Policies) {
		t.Errorf("%d descriptions for %d policies", len(PolicyDescriptions), len(Policies))
	}
	if got := PolicyDescriptions["round-robin"]; got != "per-request round-robin (ideal L7)" {
		t.Errorf("round-robin: %q", got)
	}
	if Policies[len(Policies)-1] != Oracle {
		t.Errorf("the oracle is not last: %v", Policies)
	}
}

// Jobs runs a randomised policy Draws times, draw by draw, and RunSimJobs
// carries the draw into each result; the draws differ, a seed reproduces them.
func TestJobsDraws(t *testing.T) {
	s := Scenario{Fleet: h100s(2), Workload: workload.Spec{Kind: "poisson", Seed: 3, Requests: 60, Rate: 40}}
	s.Name = "tiny"
	jobs, err := Jobs([]Scenario{s}, []string{"round-robin", KubeProxy, KubeProxyIPVS, Oracle}, SimOptions{Seed: 1, Draws: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range jobs {
		got = append(got, fmt.Sprintf("%s#%d", j.Policy, j.Draw))
	}
	want := []string{"round-robin#0", "kube-proxy#0", "kube-proxy#1", "kube-proxy#2",
		"kube-proxy-ipvs#0", "kube-proxy-ipvs#1", "kube-proxy-ipvs#2", "oracle#0"}
	if !slices.Equal(got, want) {
		t.Fatalf("jobs %v, want %v", got, want)
	}
	if jobs, _ := Jobs([]Scenario{s}, []string{KubeProxy}, SimOptions{}); len(jobs) != DefaultDraws {
		t.Fatalf("%d kube-proxy jobs by default, want %d", len(jobs), DefaultDraws)
	}
	if _, err := Jobs([]Scenario{s}, []string{"nginx"}, SimOptions{}); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
	res, err := RunSimJobs(context.Background(), jobs, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	again, err := RunSimJobs(context.Background(), jobs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Policy != jobs[i].Policy || r.Draw != jobs[i].Draw {
			t.Fatalf("result %d is %s#%d, job %s#%d", i, r.Policy, r.Draw, jobs[i].Policy, jobs[i].Draw)
		}
		if !slices.Equal(r.Records, again[i].Records) {
			t.Fatalf("%s#%d: a second run differs", r.Policy, r.Draw)
		}
	}
	if slices.Equal(res[1].Records, res[2].Records) && slices.Equal(res[2].Records, res[3].Records) {
		t.Fatal("three kube-proxy draws gave the same records")
	}
}

// The new policies reproduce exactly for a seed.
func TestBenchPoliciesDeterministic(t *testing.T) {
	fleet := simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{
		servers("h100", "h100", "8b", 1, 2, nil), servers("a10g", "a10g", "8b", 1, 2, nil)}}
	tr := chatTrace(150, 30*time.Millisecond, 400, 32)
	for _, p := range []string{KubeProxy, KubeProxyIPVS, WeightedRoundRobin, Oracle} {
		a, _, err := RunSim(context.Background(), SimOptions{Fleet: fleet, Policy: p, Seed: 5, Draw: 1}, tr)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := RunSim(context.Background(), SimOptions{Fleet: fleet, Policy: p, Seed: 5, Draw: 1}, tr)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Errorf("%s: two runs with seed 5 differ", p)
		}
	}
}

func newEngines(t *testing.T, fleet simserver.FleetSpec) []*sim.Engine {
	t.Helper()
	opts, _, err := fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var out []*sim.Engine
	for _, o := range opts {
		e, err := sim.New(o.Engine)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}
