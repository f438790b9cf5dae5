package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/workload"
)

// Objectives kvgate tune can minimise, each a figure of a run's results.
var Objectives = map[string]func(report.Result) float64{
	"p95-ttft": func(r report.Result) float64 { return r.TTFTP95ms },
	"p99-ttft": func(r report.Result) float64 { return r.TTFTP99ms },
	"p50-ttft": func(r report.Result) float64 { return r.TTFTP50ms },
	"p95-e2e":  func(r report.Result) float64 { return r.E2EP95ms },
	// Throughput is maximised: its reciprocal is minimised.
	"throughput": func(r report.Result) float64 { return 1 / math.Max(r.OutputTokensPerS, 1e-9) },
}

// TuneConfig is one `kvgate tune` invocation.
type TuneConfig struct {
	Suite                string // tune over the suite's scenarios (one of Suites), or
	TraceFile, FleetFile string // over one trace on one fleet
	Scenarios            []string
	Quick                bool
	Objective            string // a key of Objectives; default p95-ttft
	Profile              string // the starting profile (default v1alpha1.ProfileKvgate)
	// Spreads also searches the load scorers' spreads (profile design; the
	// configuration file sets only weights).
	Spreads bool
	Seed    uint64
	// Progress, when not nil, gets a line per evaluated setting: for a
	// terminal, as the command sets it.
	Progress io.Writer
}

// weightValues are the integer weights tried per scorer.
var weightValues = []float64{0, 1, 2, 3, 4, 6}

// spreadValues are the spreads tried when Spreads is set; prefillSpreadValues
// are in tokens.
var (
	spreadValues        = []float64{0, 2, 4, 8, 16}
	prefillSpreadValues = []float64{0, 1024, 4096, 16384}
)

// Tune searches the weights in virtual time by coordinate descent — each weight in
// turn over weightValues, keeping the best, until a pass changes nothing (at most
// three passes) — and
// prints the best profile, its gain over the starting one on the same traces, and
// a weights block ready to paste into a scheduler. With several scenarios the
// objective is the geometric mean of the per-scenario figures, so that no
// scenario's scale dominates.
func Tune(ctx context.Context, w io.Writer, cfg TuneConfig) (schedule.Profile, error) {
	best, _, _, err := tune(ctx, w, cfg)
	return best, err
}

// tune is Tune, which also returns the objective of the starting profile and
// of the best one.
func tune(ctx context.Context, w io.Writer, cfg TuneConfig) (schedule.Profile, float64, float64, error) {
	if cfg.Objective == "" {
		cfg.Objective = "p95-ttft"
	}
	obj, ok := Objectives[cfg.Objective]
	if !ok {
		return schedule.Profile{}, 0, 0, fmt.Errorf("unknown objective %q (known: %s)", cfg.Objective, strings.Join(slices.Sorted(maps.Keys(Objectives)), ", "))
	}
	if cfg.Profile == "" {
		cfg.Profile = string(v1alpha1.ProfileKvgate)
	}
	start, err := schedule.LookupProfile(cfg.Profile)
	if err != nil {
		return schedule.Profile{}, 0, 0, err
	}
	scenarios, traces, err := selectScenarios(Config{Suite: cfg.Suite, Scenarios: cfg.Scenarios, Quick: cfg.Quick,
		TraceFile: cfg.TraceFile, FleetFile: cfg.FleetFile, Seed: cfg.Seed})
	if err != nil {
		return schedule.Profile{}, 0, 0, err
	}
	// A pool with adapters runs its profile with loraAffinity (WithAdapters); the
	// search starts from exactly that, so that what it prints is what it ran.
	for _, tr := range traces {
		if slices.ContainsFunc(tr, func(q workload.Request) bool { return q.Adapter != "" }) {
			start = start.WithAdapters()
			break
		}
	}
	evals, began := 0, time.Now()
	// note reports an evaluated setting: what was tried, in which pass and at
	// which step of how many, its score and the best so far.
	note := func(what string, pass, step, steps int, score, best float64) {
		if cfg.Progress == nil {
			return
		}
		evals++
		at := "start"
		if pass > 0 {
			at = fmt.Sprintf("pass %d, %d/%d", pass, step, steps)
		}
		fmt.Fprintf(cfg.Progress, "  [eval %d, %s] %s → %s (best %s, %d scenario runs, %.0fs)\n", evals, at, what,
			fmtScore(cfg.Objective, score), fmtScore(cfg.Objective, best), evals*len(scenarios), time.Since(began).Seconds())
	}
	eval := func(p schedule.Profile) (float64, []report.Result, error) {
		jobs := make([]Job, len(scenarios))
		for i, s := range scenarios {
			pp := p
			jobs[i] = Job{Scenario: s, Trace: traces[i], Policy: string(v1alpha1.ProfileKvgate), Options: SimOptions{Seed: cfg.Seed, Profile: &pp}}
		}
		res, err := RunSimJobs(ctx, jobs, nil)
		if err != nil {
			return 0, nil, err
		}
		logSum := 0.0
		for _, r := range res {
			v := obj(r)
			// A run with no successful request has no latency at all: the worst
			// score, not the best.
			if r.Requests == r.Errors || math.IsNaN(v) || v <= 0 {
				v = math.MaxFloat64
			}
			logSum += math.Log(v)
		}
		return math.Exp(logSum / float64(len(res))), res, nil
	}
	fmt.Fprintf(w, "kvgate tune: objective %s over %d scenario(s), starting from profile %s\n", cfg.Objective, len(scenarios), cfg.Profile)
	best := start
	best.Weights = maps.Clone(start.Weights)
	bestScore, baseRes, err := eval(best)
	if err != nil {
		return best, 0, 0, err
	}
	startScore := bestScore
	note(cfg.Profile, 0, 0, 0, bestScore, bestScore)
	fmt.Fprintf(w, "  start  %s  → %s\n", describe(best), fmtScore(cfg.Objective, bestScore))
	var dims []string
	for _, s := range TunedScorers() {
		dims = append(dims, string(s.Name))
	}
	if cfg.Spreads {
		dims = append(dims, "queueSpread", "runningSpread", "prefillSpread")
	}
	valuesOf := func(d string) []float64 {
		switch {
		case d == "prefillSpread":
			return prefillSpreadValues
		case strings.HasSuffix(d, "Spread"):
			return spreadValues
		}
		return weightValues
	}
	steps := 0
	for _, d := range dims {
		steps += len(valuesOf(d))
	}
	for pass := 1; pass <= 3; pass++ {
		changed := false
		step := 0
		for _, d := range dims {
			for _, v := range valuesOf(d) {
				step++
				if err := ctx.Err(); err != nil {
					return best, 0, 0, err
				}
				cand := with(best, d, v)
				if cand.Equal(best) || len(activeWeights(cand)) == 0 {
					continue
				}
				score, _, err := eval(cand)
				if err != nil {
					return best, 0, 0, err
				}
				// A change must win by 1%: noise between near-equal settings must not
				// walk the weights around.
				if score < bestScore*0.99 {
					best, bestScore, changed = cand, score, true
					fmt.Fprintf(w, "  pass %d %s  → %s\n", pass, describe(best), fmtScore(cfg.Objective, bestScore))
				}
				note(fmt.Sprintf("%s %g", d, v), pass, step, steps, score, bestScore)
			}
		}
		if !changed {
			break
		}
	}
	_, bestRes, err := eval(best)
	if err != nil {
		return best, 0, 0, err
	}
	fmt.Fprintf(w, "\nbest: %s\n", describe(best))
	fmt.Fprintf(w, "%s: %s against %s with profile %s (%+.1f%%)\n", cfg.Objective, fmtScore(cfg.Objective, bestScore),
		fmtScore(cfg.Objective, startScore), cfg.Profile, (bestScore/startScore-1)*100)
	for i := range bestRes {
		fmt.Fprintf(w, "  %-15s %s → %s\n", bestRes[i].Scenario, fmtScore(cfg.Objective, obj(baseRes[i])), fmtScore(cfg.Objective, obj(bestRes[i])))
	}
	fmt.Fprintf(w, "\nPaste into the scheduler (profile %s):\n\n      profile: %s\n      weights: %s\n", cfg.Profile, cfg.Profile, weightsBlock(best))
	if cfg.Spreads {
		fmt.Fprintf(w, "      # spreads (profile code, not configuration): queue %g, running %g, prefill %g\n", best.QueueSpread, best.RunningSpread, best.PrefillSpread)
	}
	return best, startScore, bestScore, nil
}

// TunePerScenario tunes each of the suite's scenarios (cfg.Scenarios, or all)
// on its own, as Tune does, and ends with a table of how far the starting
// profile is from the best weights for each: one profile serves every
// scenario, and this says what that costs where. It returns the best profile
// of each scenario, in suite order.
func TunePerScenario(ctx context.Context, w io.Writer, cfg TuneConfig) ([]schedule.Profile, error) {
	if cfg.Suite == "" {
		return nil, fmt.Errorf("tuning per scenario needs a suite")
	}
	scenarios, err := Suite(cfg.Suite, cfg.Quick)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range scenarios {
		if len(cfg.Scenarios) == 0 || slices.Contains(cfg.Scenarios, s.Name) {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no scenario of suite %s is named %v", cfg.Suite, cfg.Scenarios)
	}
	type row struct {
		name        string
		start, best float64
		weights     string
	}
	var rows []row
	var bests []schedule.Profile
	for _, name := range names {
		one := cfg
		one.Scenarios = []string{name}
		var out strings.Builder
		best, start, found, err := tune(ctx, &out, one)
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", name, err)
		}
		fmt.Fprintf(w, "== %s\n%s\n", name, out.String())
		rows = append(rows, row{name, start, found, describe(best)})
		bests = append(bests, best)
	}
	profile := cmp.Or(cfg.Profile, string(v1alpha1.ProfileKvgate))
	objective := cmp.Or(cfg.Objective, "p95-ttft")
	fmt.Fprintf(w, "How far profile %s is from each scenario's best weights (%s):\n\n", profile, objective)
	fmt.Fprintf(w, "  %-20s %12s %12s %8s  %s\n", "scenario", profile, "best", "gain", "best weights")
	for _, r := range rows {
		fmt.Fprintf(w, "  %-20s %12s %12s %+7.1f%%  %s\n", r.name, fmtScore(objective, r.start), fmtScore(objective, r.best), (r.best/r.start-1)*100, r.weights)
	}
	return bests, nil
}

// TunedScorers are the scorers whose weights Tune searches: those the
// simulated fleet exercises (ScorerSpec.Tuned), in the order the picker runs
// them. The others score every simulated endpoint alike, and searching them
// would only cost time.
func TunedScorers() []schedule.ScorerSpec {
	return slices.DeleteFunc(schedule.Scorers(), func(s schedule.ScorerSpec) bool { return !s.Tuned })
}

func with(p schedule.Profile, dim string, v float64) schedule.Profile {
	p.Weights = maps.Clone(p.Weights)
	switch dim {
	case "queueSpread":
		p.QueueSpread = v
	case "runningSpread":
		p.RunningSpread = v
	case "prefillSpread":
		p.PrefillSpread = v
	default:
		p.Weights[v1alpha1.ScorerName(dim)] = v
	}
	return p
}

func activeWeights(p schedule.Profile) []v1alpha1.ScorerName {
	var out []v1alpha1.ScorerName
	for k, v := range p.Weights {
		if v > 0 {
			out = append(out, k)
		}
	}
	return out
}

func describe(p schedule.Profile) string {
	return fmt.Sprintf("%s spreads queue %g running %g prefill %g", weightsBlock(p), p.QueueSpread, p.RunningSpread, p.PrefillSpread)
}

// weightsBlock writes every scorer's weight, zeros included, so that pasting it
// over a profile sets them all.
func weightsBlock(p schedule.Profile) string {
	var parts []string
	for _, k := range schedule.WeightNames() {
		parts = append(parts, fmt.Sprintf("%s: %g", k, p.Weights[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func fmtScore(objective string, v float64) string {
	if objective == "throughput" {
		return fmt.Sprintf("%.0f tok/s", 1/v)
	}
	return fmt.Sprintf("%.1f ms", v)
}
