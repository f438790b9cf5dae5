package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// What one server sustains of the suite's chat traffic (prompts ~512 tokens,
// outputs ~256) at P95 TTFT < 2 s, in requests a second, from single-server
// runs: the figures the scenarios' loads are set from.
const (
	h100Rate      = 31.5 // Llama-3.1-8B on one H100
	a10gRate      = 1.7  // Llama-3.1-8B on one A10G
	h100x4Rate70b = 15.9 // Llama-3.3-70B on four H100s
)

// What one server of Llama-3.1-8B sustains of the suites' chat traffic at P95
// TTFT ≤ 2 s, in requests a second, for the generations the aws suite does not
// run: measured by sustainableRate (what weighted-round-robin weighs a server
// by: Poisson replays on one engine of 2,000 requests of the chat trace,
// bisected on the rate) on the traces of mixed-gpu and mixed-gpu-stable (seeds
// 11 and 17), which agree to within 1% (A100 11.22 and 11.31, L40S 8.86 and
// 8.95). The same measure gives today an H100 34.7 and an A10G 1.72–1.75,
// against the 31.5 and 1.7 the aws suite quotes and the mixed suite keeps.
const (
	a100Rate = 11.3 // Llama-3.1-8B on one A100
	l40sRate = 8.9  // Llama-3.1-8B on one L40S
)

// Suite returns a named set of scenarios: "aws" mirrors the table AWS published
// for its gateway (mixed GPU generations, bursts, shared prompt prefixes, a uniform
// fleet under steady load) and adds LoRA-heavy, long-context, code-generation and
// KV-pressure traffic. quick shrinks every workload for CI.
//
// Offered loads are set from the fleets' capacity, not from the targets: each
// scenario runs its fleet at a load a capacity planner would call busy but
// sufficient (about 60–75% of what the fleet sustains when traffic is spread by
// capacity), which is where routing decides latency. Two AWS conditions also
// come in a version at which every baseline's queue drains: mixed-gpu overloads
// round-robin's A10Gs, so its P95 grows with the trace; mixed-gpu-stable runs
// the fleet at what round-robin sustains. bursty's bursts are twice the fleet's
// capacity; bursty-ttft's are 1.5 times it, for longer.
//
// "mixed" (mixedSuite) compares routing on fleets of mixed GPU generations:
// mixed-gpu-stable, two fleets of other generations than the aws suite's, and
// a burst that arrives inside one scrape interval, on two and on three speeds.
// "tenants" (tenantsSuite) sweeps many tenants' long system prompts from 70%
// to 120% of the fleet's time. "replicas" (replicasSuite) runs six of these
// behind several gateway replicas, with and without shared state.
func Suite(name string, quick bool) ([]Scenario, error) {
	n := func(full int) int {
		if quick {
			return max(200, full/10)
		}
		return full
	}
	switch name {
	case "aws":
		return awsSuite(n), nil
	case "mixed":
		return mixedSuite(n), nil
	case "tenants":
		return tenantsSuite(n), nil
	case ReplicasSuite:
		return replicasSuite(n), nil
	}
	return nil, fmt.Errorf("unknown suite %q (known: %s)", name, strings.Join(Suites, ", "))
}

// Suites are the names Suite knows.
var Suites = []string{"aws", "mixed", "tenants", ReplicasSuite}

// awsSuite is the "aws" suite; n sizes a workload from its full request count.
func awsSuite(n func(int) int) []Scenario {
	// bursty-ttft: bursts at 1.5× the 70B fleet's capacity for 10 s, 20 s quiet
	// at a fifth of the burst rate.
	const burstFactor, burstOn, burstOff = 5, 10 * time.Second, 20 * time.Second
	burstRate := 1.5 * 4 * h100x4Rate70b
	burstMean := burstRate * (burstFactor*burstOn.Seconds() + burstOff.Seconds()) / (burstFactor * (burstOn + burstOff).Seconds())
	sc := []Scenario{
		{
			Scenario: report.Scenario{Name: "mixed-gpu", Baseline: "round-robin",
				Description: fmt.Sprintf("4 H100 and 4 A10G servers of Llama-3.1-8B; Poisson chat traffic (prompts ~512 tokens, outputs ~256) at 92 requests/s, 70%% of what the fleet sustains (an H100 ~%g requests/s at P95 TTFT < 2 s, an A10G ~%g). It overloads round-robin, which sends each A10G an eighth, %.1f requests/s against the ~%g it sustains: their queues grow for as long as the trace lasts (mixed-gpu-stable is the same fleet at a load round-robin sustains).",
					h100Rate, a10gRate, 92.0/8, a10gRate),
				Target: "P95 TTFT ≤ −97% against round-robin",
				Goals:  []report.Goal{{Percentile: 95, Change: -97}}},
			Fleet:    mixedFleet(),
			Workload: workload.Spec{Kind: "poisson", Seed: 11, Requests: n(20000), Rate: 92},
		},
		mixedGPUStable(n),
		{
			Scenario: report.Scenario{Name: "bursty", Baseline: "round-robin",
				Description: "4 servers of Llama-3.3-70B on 4 H100s each; on/off traffic: 5 s bursts at 10× the quiet rate, 25 s quiet; mean 32 requests/s, so that bursts arrive at twice the ~63.5 requests/s the fleet sustains and quiet spells at a fifth of it.",
				Target:      "P95 TTFT ≤ −94% and P99 ≤ −98% against round-robin",
				Goals:       []report.Goal{{Percentile: 95, Change: -94}, {Percentile: 99, Change: -98}}},
			Fleet: simserver.FleetSpec{Seed: 2, Servers: []simserver.ServerSpec{servers("h100", "h100", "70b", 4, 4, nil)}},
			Workload: workload.Spec{Kind: "bursty", Seed: 12, Requests: n(12000), Rate: 32, Model: llama70b,
				BurstFactor: 10, BurstOn: 5 * time.Second, BurstOff: 25 * time.Second},
		},
		{
			Scenario: report.Scenario{Name: "bursty-ttft", Baseline: "round-robin",
				Description: fmt.Sprintf("bursty's fleet (4 servers of Llama-3.3-70B on 4 H100s each) under %v bursts at %.3g requests/s, 1.5× the ~%.1f the fleet sustains, then %v quiet at a fifth of that; mean %.3g requests/s. A burst's backlog drains in the quiet spell that follows under every baseline, so its TTFT is what the target is about.",
					burstOn, burstRate, 4*h100x4Rate70b, burstOff, burstMean),
				Target: "P95 TTFT ≤ −94% and P99 ≤ −98% against round-robin (bursty's, on bursts every baseline drains)",
				Goals:  []report.Goal{{Percentile: 95, Change: -94}, {Percentile: 99, Change: -98}}},
			Fleet: simserver.FleetSpec{Seed: 2, Servers: []simserver.ServerSpec{servers("h100", "h100", "70b", 4, 4, nil)}},
			Workload: workload.Spec{Kind: "bursty", Seed: 18, Requests: n(12000), Rate: burstMean, Model: llama70b,
				BurstFactor: burstFactor, BurstOn: burstOn, BurstOff: burstOff},
		},
		{
			Scenario: report.Scenario{Name: "shared-prefix", Baseline: "round-robin",
				Description: "8 H100 servers of Llama-3.1-8B; 96 groups × 16 users share 8,192-token system prompts (more than one server's KV cache holds, less than the fleet's), each request adds ~256 unique tokens; Poisson at 20 requests/s, 70% of what the fleet sustains when every server sees every group (~3.6 requests/s each).",
				Target:      "P95 TTFT ≤ −50% and P99 ≤ −60% against round-robin (AWS reached −26% / −43%)",
				Goals:       []report.Goal{{Percentile: 95, Change: -50}, {Percentile: 99, Change: -60}}},
			Fleet: simserver.FleetSpec{Seed: 3, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}},
			Workload: workload.Spec{Kind: "shared-prefix", Seed: 13, Requests: n(30000), Rate: 20, Groups: 96, Users: 16, SystemTokens: 8192,
				PromptTokens: workload.Dist{Mean: 256, Sigma: 0.5, Min: 16, Max: 2048}},
		},
		{
			Scenario: report.Scenario{Name: "uniform-steady", Baseline: "round-robin",
				Description: "8 H100 servers of Llama-3.1-8B; steady Poisson chat traffic at 175 requests/s (70% of ~250), no shared prefixes.",
				Target:      "within ±5% of round-robin on P95 TTFT; throughput not lower",
				Goals:       []report.Goal{{Percentile: 95, Change: 5}}},
			Fleet:    simserver.FleetSpec{Seed: 4, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}},
			Workload: workload.Spec{Kind: "poisson", Seed: 14, Requests: n(20000), Rate: 175},
		},
		{
			Scenario: report.Scenario{Name: "lora-heavy", Baseline: "round-robin",
				Description: "8 H100 servers of Llama-3.1-8B with 4 LoRA slots each; 16 adapters with Zipf popularity (s = 1.1), 10% base-model traffic; Poisson at 15 requests/s, 70% of what the fleet sustains when every server sees every adapter (~2.7 requests/s each).",
				Target:      "kvgate ahead of round-robin, least-request and gie-default on P95 TTFT",
				Goals:       ahead()},
			Fleet: simserver.FleetSpec{Seed: 5, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, func(s *simserver.ServerSpec) {
				s.MaxLoRAs = 4
				s.LoRALoadTime = simserver.Duration(25 * time.Millisecond)
			})}},
			Workload: workload.Spec{Kind: "lora-mix", Seed: 15, Requests: n(20000), Rate: 15, Adapters: 16, ZipfS: 1.1, BaseShare: 0.1},
		},
		{
			Scenario: report.Scenario{Name: "long-context", Baseline: "round-robin",
				Description: "8 H100 servers of Llama-3.1-8B; Poisson at 12 requests/s (70% of ~17) of which 10% carry 32k-token prompts.",
				Target:      "kvgate ahead of round-robin, least-request and gie-default on P95 TTFT",
				Goals:       ahead()},
			Fleet:    simserver.FleetSpec{Seed: 6, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}},
			Workload: workload.Spec{Kind: "long-context", Seed: 16, Requests: n(10000), Rate: 12, LongShare: 0.1, LongTokens: 32768},
		},
		codeGeneration(n),
		kvPressure(n),
	}
	return sc
}

// The code-generation scenario: coding sessions on 8 H100s, whose prompts
// carry a repository's context (llm-d's code-generation trace is the model:
// prompts of thousands of tokens, most of them reused, answers of tens to a
// couple of hundred). codeGenRate puts it at 70% of the fleet's time, as
// describeLoad counts it on the full trace (TestCodeGenAndKVPressure); the
// sessions' think time does not scale with it, so the share is not quite in
// proportion to the rate.
const (
	codeGenRepos   = 128
	codeGenContext = 6144 // tokens of a repository's context
	codeGenTurns   = 5
	codeGenRate    = 124.0
)

func codeGeneration(n func(int) int) Scenario {
	return Scenario{
		Scenario: report.Scenario{Name: "code-generation", Baseline: "round-robin",
			Description: fmt.Sprintf("8 H100 servers of Llama-3.1-8B; coding sessions of %d requests ~5 s apart, each in one of %d repositories of Zipf popularity (s = 1.1) whose %s-token context every session of the repository starts with (%.0fk tokens in all, more than one server's KV cache holds, less than the fleet's); each turn carries the session's prompt and answer so far and adds ~384 tokens of instructions and code, for prompts of ~7k tokens, and the answers are short (~96 tokens, at most 256). Prefill is most of the work, and most of it is cached where the repository's context and the session already are: a router that sends a session elsewhere recomputes thousands of tokens. %g requests/s, 70%% of the fleet's time once the prompt tokens an earlier request computed are cached.",
				codeGenTurns, codeGenRepos, thousands(codeGenContext), codeGenRepos*codeGenContext/1000.0, codeGenRate),
			Target: "kvgate ahead of round-robin, least-request and gie-default on P95 TTFT",
			Goals:  ahead()},
		Fleet: simserver.FleetSpec{Seed: 10, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}},
		Workload: workload.Spec{Kind: workload.CodeGen, Seed: 23, Requests: n(15000), Rate: codeGenRate, Groups: codeGenRepos, ZipfS: 1.1,
			SystemTokens: codeGenContext, Turns: codeGenTurns, ThinkTime: 5 * time.Second,
			PromptTokens: workload.Dist{Mean: 384, Sigma: 0.6, Min: 32, Max: 4096},
			OutputTokens: workload.Dist{Mean: 96, Sigma: 0.6, Min: 8, Max: 256}},
	}
}

// The kv-pressure scenario: answers of thousands of tokens on servers whose
// KV cache holds a few of them. kvPressureRate puts it at 70% of the fleet's
// time (TestCodeGenAndKVPressure).
const kvPressureRate = 0.572

func kvPressure(n func(int) int) Scenario {
	return Scenario{
		Scenario: report.Scenario{Name: "kv-pressure", Baseline: "round-robin",
			Description: fmt.Sprintf("8 A10G servers of Llama-3.1-8B, whose weights leave each a KV cache of ~24k tokens; Poisson chat prompts (~512 tokens) with long answers, as a reasoning model gives (lognormal, mean 3,000 tokens, σ 0.5, 256 to 8,192), at %g requests/s, 70%% of the fleet's time. A server holds a handful of such sequences, each growing by thousands of tokens after it was routed: a server whose cache fills preempts its newest sequences, which wait and compute their context again, so where the next request goes decides whether a server's cache fills. The report counts each policy's preemptions.",
				kvPressureRate),
			Target: "kvgate ahead of round-robin, least-request and gie-default on P95 TTFT",
			Goals:  ahead()},
		Fleet: simserver.FleetSpec{Seed: 11, Servers: []simserver.ServerSpec{servers("a10g", "a10g", "8b", 1, 8, nil)}},
		Workload: workload.Spec{Kind: workload.Poisson, Seed: 24, Requests: n(3000), Rate: kvPressureRate,
			OutputTokens: workload.Dist{Mean: 3000, Sigma: 0.5, Min: 256, Max: 8192}},
	}
}

// thousands writes n with a comma between thousands, as the descriptions do.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// mixedGPUStable is mixed-gpu's fleet and traffic at a load round-robin
// sustains, as the aws and mixed suites both run it.
func mixedGPUStable(n func(int) int) Scenario {
	// Round-robin gives each of the 8 servers an eighth.
	const stableRate = 12
	return Scenario{
		Scenario: report.Scenario{Name: "mixed-gpu-stable", Baseline: "round-robin",
			Description: fmt.Sprintf("mixed-gpu's fleet (4 H100 and 4 A10G servers of Llama-3.1-8B) and traffic at %d requests/s, a load round-robin sustains: it sends each A10G an eighth, %.1f requests/s against the ~%g it sustains, so every baseline's queue drains and the comparison holds however long the trace.",
				stableRate, float64(stableRate)/8, a10gRate),
			Target: "P95 TTFT ≤ −97% against round-robin (mixed-gpu's, at a load every baseline sustains)",
			Goals:  []report.Goal{{Percentile: 95, Change: -97}}},
		Fleet:    mixedFleet(),
		Workload: workload.Spec{Kind: "poisson", Seed: 17, Requests: n(6000), Rate: stableRate},
	}
}

// mixedFleet is 4 H100 and 4 A10G servers of Llama-3.1-8B.
func mixedFleet() simserver.FleetSpec {
	return simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{
		servers("h100", "h100", "8b", 1, 4, nil), servers("a10g", "a10g", "8b", 1, 4, nil)}}
}

// ahead is the goal "kvgate's P95 TTFT no higher than round-robin's,
// least-request's and gie-default's".
func ahead() []report.Goal {
	return []report.Goal{{Percentile: 95}, {Percentile: 95, Against: "least-request"}, {Percentile: 95, Against: string(v1alpha1.ProfileGIEDefault)}}
}

// The burst-at-once scenario's bursts: what the mixed fleet's four H100s
// prefill in one full-budget step each (4 × 8,192 tokens of ~512-token
// prompts), arriving well inside one 50 ms scrape interval, every 10 s, over a
// light Poisson background.
const (
	spikeSize       = 64
	spikeEvery      = 10 * time.Second
	spikeSpread     = 10 * time.Millisecond
	spikeBackground = 4.0 // requests/s
)

// The burst-three-speeds scenario's fleet: 2 servers each of H100, A100 and
// A10G (the live test of a burst, TestBurstSplitsBySpeed, runs one H100, one
// A100 and one A10G).
func threeSpeeds() simserver.FleetSpec {
	return simserver.FleetSpec{Seed: 12, Servers: []simserver.ServerSpec{
		servers("h100", "h100", "8b", 1, 2, nil), servers("a100", "a100", "8b", 1, 2, nil), servers("a10g", "a10g", "8b", 1, 2, nil)}}
}

// mixedSuite is the "mixed" suite: routing on fleets of mixed GPU generations,
// where what a request waits for depends on which server gets it, at stable
// loads and under a burst the gateway's scrapes cannot see arrive.
// mixed-gpu-stable is the aws suite's; mixed-a100-l40s and mixed-generations
// run other generations at a stable load, least-request's included (on
// mixed-generations that is 42% of what the fleet sustains, not the 60–75%
// the aws suite runs at); burst-at-once sends mixed-gpu's fleet bursts that
// arrive within one scrape interval, and burst-three-speeds the same bursts to
// a fleet of three speeds, where an even split overloads the slowest and
// sending all to the fastest queues them.
//
// Each scenario has this goal against the oracle: kvgate's P95
// TTFT closes at least half of the distance it has to the oracle's today where
// that distance is above 5%. The distances are those of the full suite at seed
// 0 (`kvgate bench --suite mixed`); seeds 1 and 2 (--seed) move them by under
// 15 points (burst-at-once's +311% to +296%, the others by under 3), and
// kvgate's P95 by under 5%.
func mixedSuite(n func(int) int) []Scenario {
	stable := mixedGPUStable(n)
	stable.Target += "; P95 TTFT ≤ +30% against the oracle, half of kvgate's +61.3% today (rounded down)"
	stable.Goals = append(stable.Goals, report.Goal{Percentile: 95, Change: 30, Against: Oracle})

	// mixed-a100-l40s: 64% of 4 A100s and 4 L40Ss spread by capacity.
	const a100L40sRate = 52
	// mixed-generations: least-request's count of requests in flight
	// overloads the A10Gs well below 60% of the fleet: its P95 grows over the
	// run from ~52 requests/s (0.67 s over 15,000 requests at 52, 1.7 s at 55,
	// 10 s at 69, 65%), and holds at ~0.26 s at 45 over 30,000.
	const generationsRate = 45
	generationsCapacity := 2 * (h100Rate + a100Rate + l40sRate + a10gRate)
	burstRate := spikeSize/spikeEvery.Seconds() + spikeBackground
	threeSpeedsCapacity := 2 * (h100Rate + a100Rate + a10gRate)
	return []Scenario{
		stable,
		{
			Scenario: report.Scenario{Name: "mixed-a100-l40s", Baseline: "least-request",
				Description: fmt.Sprintf("4 A100 and 4 L40S servers of Llama-3.1-8B; Poisson chat traffic (prompts ~512 tokens, outputs ~256) at %d requests/s, %.0f%% of what the fleet sustains when traffic is spread by capacity (an A100 ~%g requests/s at P95 TTFT < 2 s, an L40S ~%g). Round-robin sends each server an eighth, %.1f requests/s, below what an L40S sustains, so it drains, as every load-aware baseline does (kube-proxy's pinned connections overload a server in some draws); the generations differ by %.2g×, not mixed-gpu's %.0f×, so what a router can gain is in finer differences of queue and speed.",
					a100L40sRate, 100*a100L40sRate/(4*(a100Rate+l40sRate)), a100Rate, l40sRate, a100L40sRate/8.0, a100Rate/l40sRate, h100Rate/a10gRate),
				Target: "P95 TTFT ≤ +2.6% against the oracle, half of kvgate's +5.3% today (rounded down; just above the issue's 5% threshold: seeds 1 and 2 give +5.3% and +3.8%), and no higher than least-request's",
				Goals:  []report.Goal{{Percentile: 95, Change: 2.6, Against: Oracle}, {Percentile: 95}}},
			Fleet:    simserver.FleetSpec{Seed: 7, Servers: []simserver.ServerSpec{servers("a100", "a100", "8b", 1, 4, nil), servers("l40s", "l40s", "8b", 1, 4, nil)}},
			Workload: workload.Spec{Kind: "poisson", Seed: 19, Requests: n(12000), Rate: a100L40sRate},
		},
		{
			Scenario: report.Scenario{Name: "mixed-generations", Baseline: "least-request",
				Description: fmt.Sprintf("2 servers each of H100, A100, L40S and A10G with Llama-3.1-8B; Poisson chat traffic at %d requests/s, %.0f%% of what the fleet sustains when traffic is spread by capacity (~%g, %g, %g and %g requests/s a server at P95 TTFT < 2 s), the load at which least-request still drains: its count of requests in flight sends the A10Gs more than they sustain from ~52 requests/s. Round-robin, which sends each A10G an eighth, %.1f requests/s against the ~%g it sustains, does not drain, as on mixed-gpu, nor do random and kube-proxy.",
					generationsRate, 100*generationsRate/generationsCapacity, h100Rate, a100Rate, l40sRate, a10gRate, generationsRate/8.0, a10gRate),
				Target: "P95 TTFT ≤ +46% against the oracle, half of kvgate's +93.9% today (rounded down), and no higher than least-request's",
				Goals:  []report.Goal{{Percentile: 95, Change: 46, Against: Oracle}, {Percentile: 95}}},
			Fleet: simserver.FleetSpec{Seed: 8, Servers: []simserver.ServerSpec{
				servers("h100", "h100", "8b", 1, 2, nil), servers("a100", "a100", "8b", 1, 2, nil),
				servers("l40s", "l40s", "8b", 1, 2, nil), servers("a10g", "a10g", "8b", 1, 2, nil)}},
			Workload: workload.Spec{Kind: "poisson", Seed: 20, Requests: n(15000), Rate: generationsRate},
		},
		{
			Scenario: report.Scenario{Name: "burst-at-once", Baseline: "least-request",
				Description: fmt.Sprintf("mixed-gpu's fleet (4 H100 and 4 A10G servers of Llama-3.1-8B); every %v a burst of %d chat requests (~%dk prompt tokens, what the four H100s prefill in one full-budget step each) arrives within %v, inside one of the gateway's 50 ms scrape intervals, so that no scrape a router reads shows the burst; under it a Poisson background at %g requests/s; mean %.3g requests/s, %.0f%% of what the fleet sustains spread by capacity. Round-robin sends an A10G an eighth of each burst and of the background, %.2g requests/s against the ~%g it sustains, and every baseline's queue drains between bursts, but for kube-proxy's in some draws, whose pinned connections overload a server.",
					spikeEvery, spikeSize, spikeSize*512/1000, spikeSpread, spikeBackground, burstRate, 100*burstRate/(4*(h100Rate+a10gRate)), burstRate/8, a10gRate),
				Target: "P95 TTFT ≤ +155% against the oracle, half of kvgate's +311.1% today (rounded down), and no higher than least-request's",
				Goals:  []report.Goal{{Percentile: 95, Change: 155, Against: Oracle}, {Percentile: 95}}},
			Fleet: mixedFleet(),
			Workload: workload.Spec{Kind: workload.Spike, Seed: 21, Requests: n(3000), Rate: burstRate,
				BurstSize: spikeSize, BurstEvery: spikeEvery, BurstSpread: spikeSpread},
		},
		{
			Scenario: report.Scenario{Name: "burst-three-speeds", Baseline: "least-request",
				Description: fmt.Sprintf("2 servers each of H100, A100 and A10G with Llama-3.1-8B (~%g, %g and %g requests/s a server at P95 TTFT < 2 s: three speeds, %.0f× apart at the ends); burst-at-once's traffic: every %v a burst of %d chat requests within %v, inside one 50 ms scrape interval, over a Poisson background at %g requests/s; mean %.3g requests/s, %.0f%% of what the fleet sustains spread by capacity. No scrape shows a burst before it is placed: an even split sends each A10G a sixth of it, %.1f requests, which it prefills about ten times slower than an H100 does, and sending the whole burst to the fastest queues it there. The split has to follow the speeds a router learned from earlier answers.",
					h100Rate, a100Rate, a10gRate, h100Rate/a10gRate, spikeEvery, spikeSize, spikeSpread, spikeBackground, burstRate, 100*burstRate/threeSpeedsCapacity, spikeSize/6.0),
				Target: "P95 TTFT ≤ +27% against the oracle, half of kvgate's +54.8% today (rounded down; seeds 1 and 2 give +61.5% and +56.5%), and no higher than least-request's",
				Goals:  []report.Goal{{Percentile: 95, Change: 27, Against: Oracle}, {Percentile: 95}}},
			Fleet: threeSpeeds(),
			Workload: workload.Spec{Kind: workload.Spike, Seed: 25, Requests: n(3000), Rate: burstRate,
				BurstSize: spikeSize, BurstEvery: spikeEvery, BurstSpread: spikeSpread},
		},
	}
}

// The tenants suite's traffic: llm-d's precise-prefix benchmark's tenants
// (150 groups of 6,000-token system prompts; its questions are 1,200 tokens
// and its answers 1,000, here the suite's chat questions and answers).
const (
	tenantCount  = 150
	tenantPrompt = 6000 // tokens of a tenant's system prompt
)

// tenantLoadPerRate is the share of the fleet's time one request a second of
// the tenants suite's full trace takes, as describeLoad counts it with the
// system prompts cached (TestTenantsSuite measures it); the trace is the same
// at every load but for its arrivals, which scale with the rate.
const tenantLoadPerRate = 0.0160286

// tenantLoads are the tenants suite's loads, in percent of the fleet's time.
var tenantLoads = []int{70, 90, 100, 110, 120}

// tenantsSuite is the "tenants" suite: many tenants' system prompts, more
// than one server's KV cache holds and less than the fleet's, on 8 H100s,
// swept from 70% to 120% of the fleet's time as describeLoad counts it. A
// prefix-aware router keeps each tenant's prompt on few servers; one that
// spreads them recomputes 6,000 tokens at each miss, which costs several
// times the fleet's time. Every scenario replays the same requests, at
// arrivals scaled to its load.
func tenantsSuite(n func(int) int) []Scenario {
	var out []Scenario
	for _, pct := range tenantLoads {
		// Two decimals keep the load the report prints to within 0.1%.
		rate := math.Round(float64(pct)/100/tenantLoadPerRate*100) / 100
		var why string
		switch {
		case pct < 100:
			why = "below it, a router that keeps tenants together keeps up, and one that spreads them falls behind"
		case pct == 100:
			why = "no time to spare, as counted here"
		default:
			why = "more time than the fleet has, as counted here"
		}
		out = append(out, Scenario{
			Scenario: report.Scenario{Name: fmt.Sprintf("many-tenants-%d", pct), Baseline: "least-request",
				Description: fmt.Sprintf("8 H100 servers of Llama-3.1-8B; %d tenants, each with its own %s-token system prompt (llm-d's precise-prefix benchmark; %.0fk tokens in all, twice what one server's KV cache holds, a quarter of the fleet's), each request adding a unique question of ~256 tokens and answered in ~256; Poisson at %g requests/s, %d%% of the fleet's time once the system prompts are cached: %s. A router that keeps each tenant on a few servers computes its system prompt once a server; one that spreads the tenants computes each on every server and evicts the others', %s tokens of prefill at each miss. The fleet's time counts each running sequence's whole context against its server's KV cache, though the sequences of one tenant on one server share their system prompt's blocks: a router that keeps tenants together holds larger batches than that count, and may drain above 100%%.",
					tenantCount, thousands(tenantPrompt), tenantCount*tenantPrompt/1000.0, rate, pct, why, thousands(tenantPrompt))},
			Fleet: simserver.FleetSpec{Seed: 9, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}},
			Workload: workload.Spec{Kind: workload.SharedPrefix, Seed: 22, Requests: n(10000), Rate: rate,
				Groups: tenantCount, Users: 5, SystemTokens: tenantPrompt,
				PromptTokens: workload.Dist{Mean: 256, Sigma: 0.5, Min: 16, Max: 2048}},
		})
	}
	return out
}
