package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/schedule"
)

// ReplicasSuite runs gateway replicas (replicas.go) rather than comparing
// policies: each scenario behind 1, 2, 4 and 8 replicas, each number with and
// without shared state.
const ReplicasSuite = "replicas"

// DefaultReplicas are the replica counts the replicas suite runs.
var DefaultReplicas = []int{1, 2, 4, 8}

// The replicas suite's other runs: the reference policy at one replica, and,
// at the most replicas, the delays swept and the profile without learned
// speeds.
const (
	replicasPolicy    = string(v1alpha1.ProfileChat) // kvgate's default profile
	replicasReference = "least-request"
)

// replicaSweep is the sharing swept at the most replicas, besides the
// configured one: at once; 1 and 3 ms late at each change (3 ms: the measured
// p99); 3, 10 and 30 ms late with loads published every 2 ms.
func replicaSweep(cfg Config) [][2]time.Duration {
	var out [][2]time.Duration
	for _, d := range [][2]time.Duration{{0, 0}, {time.Millisecond, 0}, {3 * time.Millisecond, 0}, {3 * time.Millisecond, 2 * time.Millisecond},
		{10 * time.Millisecond, 2 * time.Millisecond}, {30 * time.Millisecond, 2 * time.Millisecond}} {
		if d != [2]time.Duration{cfg.SyncDelay, cfg.SyncEvery} {
			out = append(out, d)
		}
	}
	return out
}

// The parts of the replicas suite a run belongs to.
const (
	partReplicas  = "replicas"  // the policy at each replica count, shared and not
	partReference = "reference" // the reference policy at one replica
	partDelay     = "delay"     // the most replicas, shared, at other delays
	partSpeed     = "speed"     // the profile without learned speeds
)

// replicasSuite is the "replicas" suite: the scenarios where replicas matter.
// shared-prefix's and many-tenants-100's hit rates depend on each replica
// knowing where every group's system prompt went (many-tenants-100's 150
// prompts, at the whole of the fleet's time, leave no room for a replica
// that does not); burst-at-once's and burst-three-speeds' 64 requests within
// 10 ms reach every replica between two scrapes, on two and three speeds;
// mixed-gpu-stable and uniform-steady are steady traffic on a mixed and a
// uniform fleet.
func replicasSuite(n func(int) int) []Scenario {
	all := slices.Concat(awsSuite(n), mixedSuite(n), tenantsSuite(n))
	var out []Scenario
	for _, name := range []string{"shared-prefix", "many-tenants-100", "burst-at-once", "burst-three-speeds", "mixed-gpu-stable", "uniform-steady"} {
		s := all[slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })]
		// The goals are the replicas report's own (goalHitRatio, goalP95).
		s.Target, s.Goals = "", nil
		out = append(out, s)
	}
	return out
}

// replicaVariant is how a scenario is routed in one run.
type replicaVariant struct {
	part         string
	policy       string
	replicas     int
	shared       bool
	delay, every time.Duration
}

func (v replicaVariant) String() string {
	s := fmt.Sprintf("%s ×%d", v.policy, v.replicas)
	if v.shared {
		s += fmt.Sprintf(" shared %v/%v", v.delay, v.every)
	}
	return s
}

// replicaVariants are the runs of one scenario: policies at each replica
// count, unshared and (above one) shared with the configured delay; the
// reference at one replica; at the most replicas, the first policy shared as
// replicaSweep says; and on a fleet of several kinds of GPU, where a replica's learned
// speeds matter, chat-fixed-speed at one replica and at the most, sharing at
// once and as configured.
func replicaVariants(cfg Config, s Scenario) []replicaVariant {
	counts := cfg.Replicas
	if len(counts) == 0 {
		counts = DefaultReplicas
	}
	policies := cfg.Policies
	if len(policies) == 0 {
		policies = []string{replicasPolicy}
	}
	most := slices.Max(counts)
	var out []replicaVariant
	// A run another part already has is not run twice.
	add := func(v replicaVariant) {
		if !slices.ContainsFunc(out, func(o replicaVariant) bool { o.part = v.part; return o == v }) {
			out = append(out, v)
		}
	}
	for _, p := range policies {
		for _, n := range counts {
			add(replicaVariant{part: partReplicas, policy: p, replicas: n})
			if n > 1 {
				add(replicaVariant{part: partReplicas, policy: p, replicas: n, shared: true, delay: cfg.SyncDelay, every: cfg.SyncEvery})
			}
		}
	}
	add(replicaVariant{part: partReference, policy: replicasReference, replicas: 1})
	if most == 1 {
		return out
	}
	main := policies[0]
	for _, s := range replicaSweep(cfg) {
		add(replicaVariant{part: partDelay, policy: main, replicas: most, shared: true, delay: s[0], every: s[1]})
	}
	if len(s.Fleet.Servers) > 1 && learnsSpeed(main) {
		for _, v := range []replicaVariant{{replicas: 1}, {replicas: most, shared: true},
			{replicas: most, shared: true, delay: cfg.SyncDelay, every: cfg.SyncEvery}} {
			v.part, v.policy = partSpeed, ChatFixedSpeed
			add(v)
		}
	}
	return out
}

// learnsSpeed says whether a policy's picker learns each endpoint's speed
// from its answers (the predictedLatency scorer).
func learnsSpeed(policy string) bool {
	p, err := schedule.LookupProfile(policy)
	return err == nil && p.Weights[v1alpha1.ScorerPredictedLatency] > 0
}

// ReplicaResult is one run of the replicas suite, as results.json holds it.
type ReplicaResult struct {
	report.Result
	Part     string `json:"part"`
	Replicas int    `json:"replicas"`
	Shared   bool   `json:"shared"`
	// SyncDelayMS and SyncEveryMS are the sharing's delay and publication
	// period, for shared runs.
	SyncDelayMS *float64 `json:"sync_delay_ms,omitempty"`
	SyncEveryMS *float64 `json:"sync_every_ms,omitempty"`
	// MaxInFlight is the most requests one endpoint had in flight at once,
	// from all replicas; MaxInFlightPerEndpoint gives it per endpoint.
	MaxInFlight            int   `json:"max_in_flight"`
	MaxInFlightPerEndpoint []int `json:"max_in_flight_per_endpoint"`
}

func (r ReplicaResult) variant() replicaVariant {
	v := replicaVariant{part: r.Part, policy: r.Policy, replicas: r.Replicas, shared: r.Shared}
	if r.Shared {
		v.delay = time.Duration(*r.SyncDelayMS * float64(time.Millisecond))
		v.every = time.Duration(*r.SyncEveryMS * float64(time.Millisecond))
	}
	return v
}

// runReplicas runs the replicas suite: every scenario under each of its
// replicaVariants.
func runReplicas(ctx context.Context, w io.Writer, cfg Config) error {
	if err := checkReplicas(cfg); err != nil {
		return err
	}
	scenarios, traces, err := selectScenarios(cfg)
	if err != nil {
		return err
	}
	if err := saveTraces(cfg, scenarios, traces); err != nil {
		return err
	}
	type job struct {
		s int
		v replicaVariant
	}
	var jobs []job
	for i, s := range scenarios {
		for _, v := range replicaVariants(cfg, s) {
			jobs = append(jobs, job{i, v})
		}
	}
	// The costliest first, so that two cores finish together: a run costs
	// about its requests, a shared one more per replica.
	cost := func(j job) int {
		c := len(traces[j.s])
		if j.v.shared {
			c *= 1 + j.v.replicas/2
		}
		return c
	}
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cost(jobs[b]), cost(jobs[a])) })
	fmt.Fprintf(w, "kvgate bench: %d scenarios behind gateway replicas (%d runs) in virtual time\n", len(scenarios), len(jobs))
	start := time.Now()
	var progress io.Writer
	if cfg.Progress != nil {
		progress = &counted{w: cfg.Progress, total: len(jobs)}
	}
	results := make([]ReplicaResult, len(jobs))
	var mu sync.Mutex
	err = inParallel(ctx, len(jobs), func(k int) error {
		i := order[k]
		j := jobs[i]
		began := time.Now()
		s := scenarios[j.s]
		opts := SimOptions{Fleet: s.Fleet, Policy: j.v.policy, Seed: cfg.Seed, Replicas: j.v.replicas, Shared: j.v.shared,
			SyncDelay: j.v.delay, SyncEvery: j.v.every}
		out, err := simulate(ctx, opts, traces[j.s])
		if err != nil {
			return fmt.Errorf("%s / %v: %w", s.Name, j.v, err)
		}
		results[i] = replicaResult(s.Name, j.v, out)
		finished(progress, &mu, s.Name, j.v.String(), results[i].Result, began)
		return nil
	})
	if err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(w, "done in %.1fs\n\n", took.Seconds())
	doc := replicasDoc{cfg: cfg, scenarios: scenarios, results: results, took: took}
	fmt.Fprint(w, doc.summary())
	if cfg.Out == "" {
		return nil
	}
	return doc.write(w)
}

// checkReplicas refuses what the replicas suite cannot run.
func checkReplicas(cfg Config) error {
	if cfg.SyncDelay < 0 || cfg.SyncEvery < 0 {
		return fmt.Errorf("--sync-delay %v and --sync-every %v cannot be negative", cfg.SyncDelay, cfg.SyncEvery)
	}
	for _, n := range cfg.Replicas {
		if n < 1 {
			return fmt.Errorf("--replicas: %d replicas", n)
		}
	}
	for _, p := range cfg.Policies {
		if !slices.Contains(Policies, p) {
			return fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(Policies, ", "))
		}
		if benchPolicy(p) {
			return fmt.Errorf("policy %q picks without a gateway: it has no replicas", p)
		}
	}
	return nil
}

func replicaResult(scenario string, v replicaVariant, out simOutput) ReplicaResult {
	r := ReplicaResult{Result: report.Summarize(scenario, v.policy, "sim", out.recs), Part: v.part, Replicas: v.replicas, Shared: v.shared,
		MaxInFlight: slices.Max(out.maxInFlight), MaxInFlightPerEndpoint: out.maxInFlight}
	r.Preemptions = int(out.stats.Preemptions)
	if v.shared {
		d, e := ms(v.delay), ms(v.every)
		r.SyncDelayMS, r.SyncEveryMS = &d, &e
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// write writes report.md and results.json into the output directory.
func (d replicasDoc) write(w io.Writer) error {
	if err := os.MkdirAll(d.cfg.Out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(d.results, "", "  ")
	if err != nil {
		return err
	}
	md, jp := filepath.Join(d.cfg.Out, "report.md"), filepath.Join(d.cfg.Out, "results.json")
	if err := errors.Join(os.WriteFile(jp, append(js, '\n'), 0o644), os.WriteFile(md, []byte(d.markdown()), 0o644)); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	fmt.Fprintf(w, "\nreport: %s  results: %s\n", md, jp)
	return nil
}
