package bench

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/sim"
)

// The bench-side policies: what a fleet gets without a gateway, and a reference
// no gateway can reach. They are not kvgate configurations and do not go
// through the routing core: RunSim asks them for an engine index directly.
const (
	KubeProxy          = "kube-proxy"
	KubeProxyIPVS      = "kube-proxy-ipvs"
	WeightedRoundRobin = "weighted-round-robin"
	Oracle             = "oracle"
	// ChatFixedSpeed is the chat profile without predictedLatency: kvgate's
	// default before it learned endpoints' speeds, the comparison that
	// shows what the scorer adds.
	ChatFixedSpeed = "chat-fixed-speed"
	// PredictedLatency is kvgate's picker with the predictedLatency scorer
	// alone.
	PredictedLatency = "predicted-latency"
)

// benchProfile is the profile of a policy the bench defines from kvgate's
// scorers rather than a profile a scheduler can name.
func benchProfile(policy string) (schedule.Profile, bool) {
	switch policy {
	case ChatFixedSpeed:
		p, err := schedule.LookupProfile(string(v1alpha1.ProfileChat))
		if err != nil {
			return schedule.Profile{}, false
		}
		delete(p.Weights, v1alpha1.ScorerPredictedLatency)
		return p, true
	case PredictedLatency:
		return schedule.Profile{Weights: schedule.Weights{v1alpha1.ScorerPredictedLatency: 1}}, true
	}
	return schedule.Profile{}, false
}

// PolicyDescriptions says in one line what each of Policies does, for the
// report; a kvgate profile's line is the registry's (schedule.Profiles).
var PolicyDescriptions = withProfiles(map[string]string{
	"round-robin":   "per-request round-robin (ideal L7)",
	"least-request": "fewest requests in flight through the gateway, ties at random",
	"random":        "an endpoint drawn uniformly at random per request",
	"power-of-two":  "the fewer requests in flight of two endpoints drawn at random",
	KubeProxy: "Kubernetes Service (kube-proxy, iptables mode) for OpenAI clients: each client keeps one connection, " +
		"pinned to a pod drawn at random when it opened (4 clients per pod by default)",
	KubeProxyIPVS: "kube-proxy in IPVS mode: each client's one kept-alive connection is given a pod round-robin " +
		"as connections open, in a random client order",
	WeightedRoundRobin: "smooth weighted round-robin, static weights from each server's measured capacity " +
		"(highest rate at P95 TTFT ≤ 2 s on this workload)",
	ChatFixedSpeed: "kvgate's chat profile without predictedLatency (its default before it learned each endpoint's speed)",
	PredictedLatency: "kvgate's picker with the predictedLatency scorer alone: each endpoint's time to first token for the request, " +
		"predicted from the speed learned of its answers",
	// The report labels the oracle a reference itself.
	Oracle: "sees every engine's exact state at each arrival (no scrape lag) and sends the request where its " +
		"simulated TTFT is lowest",
})

// withProfiles adds the built-in profiles' descriptions to a policy's.
func withProfiles(m map[string]string) map[string]string {
	for _, p := range schedule.Profiles() {
		m[string(p.Name)] = p.Description
	}
	return m
}

// DefaultDraws is how many runs Jobs makes of a randomised policy.
const DefaultDraws = 10

// PolicyDraws is how many runs a policy needs for a figure that is not one
// draw's luck: draws (DefaultDraws when 0) for kube-proxy and kube-proxy-ipvs,
// whose pinning is drawn once per run, else 1. (random and power-of-two draw
// per request: one run averages over thousands of draws.)
func PolicyDraws(policy string, draws int) int {
	if policy != KubeProxy && policy != KubeProxyIPVS {
		return 1
	}
	if draws <= 0 {
		return DefaultDraws
	}
	return draws
}

// benchPolicy reports whether the policy is picked by the bench, not the
// routing core.
func benchPolicy(name string) bool {
	switch name {
	case KubeProxy, KubeProxyIPVS, WeightedRoundRobin, Oracle:
		return true
	}
	return false
}

// benchPicker returns the engine a bench-side policy picks for each arrival,
// in arrival order.
func (r *simRun) benchPicker(arrivals []sim.Arrival) (func(a sim.Arrival) int, error) {
	n := len(r.engines)
	switch r.opts.Policy {
	case KubeProxy, KubeProxyIPVS:
		pod := connections(r.opts.Policy, r.clients(), n, r.opts.Seed, r.opts.Draw)
		client := clientsOf(len(arrivals), len(pod), r.opts.Seed)
		return func(a sim.Arrival) int { return pod[client[a.Req.Tag]] }, nil
	case WeightedRoundRobin:
		w, err := r.capacities(arrivals)
		if err != nil {
			return nil, err
		}
		s := newSmoothWRR(w)
		return func(sim.Arrival) int { return s.next() }, nil
	case Oracle:
		o := newOracle(r.engines)
		o.exhaustive = r.opts.exhaustive
		return o.pick, nil
	}
	return nil, fmt.Errorf("unknown policy %q", r.opts.Policy)
}

// clients is the number of client connections kube-proxy balances.
func (r *simRun) clients() int {
	if r.opts.Clients > 0 {
		return r.opts.Clients
	}
	return 4 * len(r.engines)
}

// clientsOf assigns each request of the trace to one of c clients, uniformly at
// random and independently (many users behind a few client processes), from
// the run's seed alone: every draw of a policy replays the same clients, so
// draws differ only in where the connections went.
func clientsOf(requests, c int, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, 0xc11e27))
	out := make([]int, requests)
	for i := range out {
		out[i] = rng.IntN(c)
	}
	return out
}

// connections returns the pod each of c clients' one kept-alive connection
// goes to, for draw draw of the policy. kube-proxy's iptables rules send a new
// connection to each of n pods with equal probability; IPVS's rr scheduler
// gives connections pods in turn, in the order they open, which here is a
// random order of the clients per draw.
func connections(policy string, c, n int, seed uint64, draw int) []int {
	rng := drawRand(seed, draw)
	pod := make([]int, c)
	if policy == KubeProxyIPVS {
		for k, client := range rng.Perm(c) {
			pod[client] = k % n
		}
		return pod
	}
	for i := range pod {
		pod[i] = rng.IntN(n)
	}
	return pod
}

// drawRand is the randomness of one draw of a policy: the run's seed offset by
// the draw.
func drawRand(seed uint64, draw int) *rand.Rand {
	return rand.New(rand.NewPCG(seed+uint64(draw), 0x6b7072))
}

// smoothWRR is nginx's smooth weighted round-robin: each pick adds every
// server's weight to its current value and takes the highest (ties to the
// lowest index), which then gives back the sum of the weights. Over any
// window of picks each server's share follows its weight, interleaved.
type smoothWRR struct {
	weight, current []float64
	total           float64
}

func newSmoothWRR(w []float64) *smoothWRR {
	s := &smoothWRR{weight: w, current: make([]float64, len(w))}
	for _, x := range w {
		s.total += x
	}
	return s
}

func (s *smoothWRR) next() int {
	best := 0
	for i, w := range s.weight {
		s.current[i] += w
		if s.current[i] > s.current[best] {
			best = i
		}
	}
	s.current[best] -= s.total
	return best
}

// Capacity measure of weighted-round-robin.
const (
	capacitySLO    = 2 * time.Second // P95 TTFT a server must hold
	capacitySample = 2000            // requests of the trace replayed per trial
)

// capacities are the weighted-round-robin weights: each server's sustainable
// rate on this trace (sustainableRate), measured once per kind of server.
func (r *simRun) capacities(arrivals []sim.Arrival) ([]float64, error) {
	sample := sampleRequests(arrivals, capacitySample)
	byKind := map[sim.Config]float64{}
	out := make([]float64, len(r.engines))
	for i, e := range r.engines {
		cfg := e.Config()
		cfg.Seed = 0
		c, ok := byKind[cfg]
		if !ok {
			var err error
			if c, err = sustainableRate(cfg, sample); err != nil {
				return nil, fmt.Errorf("server %d: capacity: %w", i, err)
			}
			byKind[cfg] = c
		}
		out[i] = c
	}
	return out, nil
}

// sampleRequests takes up to n requests spread evenly over the trace, so that
// the sample keeps its mix of lengths, adapters and shared prefixes.
func sampleRequests(arrivals []sim.Arrival, n int) []sim.Request {
	if len(arrivals) <= n {
		out := make([]sim.Request, len(arrivals))
		for i, a := range arrivals {
			out[i] = a.Req
		}
		return out
	}
	out := make([]sim.Request, n)
	for i := range out {
		out[i] = arrivals[i*len(arrivals)/n].Req
	}
	return out
}

// sustainableRate is what a careful operator measures before setting static
// weights: the highest Poisson rate of these requests one server of cfg serves
// with P95 TTFT ≤ 2 s (the measure the suite's capacities quote). The search
// starts from the throughput of the requests all queued at once, doubles until
// P95 breaks the bar, then bisects. When a server cannot meet 2 s even lightly
// loaded (long prompts), the bar is twice its P95 at a hundredth of that rate.
func sustainableRate(cfg sim.Config, reqs []sim.Request) (float64, error) {
	if len(reqs) == 0 {
		return 0, fmt.Errorf("no requests")
	}
	sat, _, err := replayAt(cfg, reqs, 0)
	if err != nil {
		return 0, err
	}
	_, light, err := replayAt(cfg, reqs[:min(len(reqs), 100)], sat/100)
	if err != nil {
		return 0, err
	}
	slo := max(capacitySLO, 2*light)
	meets := func(rate float64) (bool, error) {
		_, p95, err := replayAt(cfg, reqs, rate)
		return p95 <= slo, err
	}
	lo, hi := sat/100, sat
	for range 10 {
		ok, err := meets(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo, hi = hi, 2*hi
	}
	for range 8 {
		mid := (lo + hi) / 2
		ok, err := meets(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// replayAt replays reqs on one fresh engine as Poisson arrivals at rate (all at
// once when rate is 0) and returns the completed requests per second, first
// arrival to last completion, and the P95 TTFT. Requests the server cannot hold
// are left out.
func replayAt(cfg sim.Config, reqs []sim.Request, rate float64) (float64, time.Duration, error) {
	e, err := sim.New(cfg)
	if err != nil {
		return 0, 0, err
	}
	rng := rand.New(rand.NewPCG(0xca9, 0x17))
	seqs := make([]*sim.Seq, 0, len(reqs))
	var at time.Duration
	for i := 0; i < len(reqs) || e.Busy(); {
		if i < len(reqs) && (!e.Busy() || at <= e.Now()) {
			if !e.Busy() {
				e.AdvanceTo(at)
			}
			if s, err := e.SubmitAt(reqs[i], at); err == nil {
				seqs = append(seqs, s)
			}
			i++
			if rate > 0 {
				at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			}
			continue
		}
		e.Step()
	}
	if len(seqs) == 0 {
		return 0, 0, fmt.Errorf("no request fits the server")
	}
	ttft := make([]time.Duration, len(seqs))
	var end time.Duration
	for i, s := range seqs {
		ttft[i] = s.FirstToken - s.Arrival
		end = max(end, s.Done)
	}
	slices.SortFunc(ttft, cmp.Compare)
	p95 := ttft[min(max((95*len(ttft)+99)/100, 1), len(ttft))-1]
	return float64(len(seqs)) / max(end.Seconds(), 1e-9), p95, nil
}
