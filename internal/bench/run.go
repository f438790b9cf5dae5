package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Config is one `kvgate bench` invocation.
type Config struct {
	Mode      string   // "sim" (default) or "live"
	Suite     string   // one of Suites; "" is "aws"
	Scenarios []string // subset of the suite; empty: all
	Policies  []string // empty: Policies
	Quick     bool
	// Draws is how many runs a randomised policy gets (PolicyDraws; 0: its
	// default).
	Draws int
	Out   string // directory for results.json, report.md, plots; "" writes nothing
	Seed  uint64
	// TraceFile and FleetFile replay a recorded trace on a described fleet
	// instead of the suite (scenario "replay").
	TraceFile, FleetFile string
	// SaveTraces writes each scenario's trace to Out/traces/<scenario>.jsonl.
	SaveTraces bool
	// CommandLine is quoted in the report.
	CommandLine string
	Live        LiveConfig
	// Replicas, SyncDelay and SyncEvery are the replicas suite's: the replica
	// counts (empty: DefaultReplicas), how late shared state reaches the
	// other replicas and how often each publishes its loads (0 and 0: at
	// once).
	Replicas             []int
	SyncDelay, SyncEvery time.Duration
	// Progress, when not nil, gets a line per finished job (done/total) and per
	// floor computed: for a terminal, as the command sets it.
	Progress io.Writer
}

// Run runs the benchmark, prints a summary to w and writes the report.
func Run(ctx context.Context, w io.Writer, cfg Config) error {
	if cfg.Suite != ReplicasSuite && len(cfg.Replicas) > 0 {
		return fmt.Errorf("--replicas applies to --suite %s", ReplicasSuite)
	}
	switch cfg.Mode {
	case "", "sim":
		if cfg.Suite == ReplicasSuite {
			return runReplicas(ctx, w, cfg)
		}
		return runSim(ctx, w, cfg)
	case "live":
		if cfg.Suite == ReplicasSuite {
			return fmt.Errorf("the %s suite runs in virtual time only (--mode sim)", ReplicasSuite)
		}
		return runLive(ctx, w, cfg)
	default:
		return fmt.Errorf("unknown mode %q (sim or live)", cfg.Mode)
	}
}

func runSim(ctx context.Context, w io.Writer, cfg Config) error {
	scenarios, traces, err := selectScenarios(cfg)
	if err != nil {
		return err
	}
	policies := cfg.Policies
	if len(policies) == 0 {
		policies = Policies
	}
	runs := 0
	for _, p := range policies {
		if !slices.Contains(Policies, p) {
			return fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(Policies, ", "))
		}
		runs += PolicyDraws(p, cfg.Draws)
	}
	if err := saveTraces(cfg, scenarios, traces); err != nil {
		return err
	}
	fmt.Fprintf(w, "kvgate bench: %d scenarios × %d policies (%d runs) in virtual time\n", len(scenarios), len(policies), runs*len(scenarios))
	start := time.Now()
	if err := floors(ctx, cfg.Progress, scenarios, traces); err != nil {
		return err
	}
	var jobs []Job
	for i, s := range scenarios {
		for _, p := range policies {
			// A randomised policy runs in draws 0, 1, … (its seed offset); any
			// other once.
			for d := range PolicyDraws(p, cfg.Draws) {
				jobs = append(jobs, Job{Scenario: s, Trace: traces[i], Policy: p, Draw: d, Options: SimOptions{Seed: cfg.Seed}})
			}
		}
	}
	var progress io.Writer
	if cfg.Progress != nil {
		progress = &counted{w: cfg.Progress, total: len(jobs)}
	}
	results, err := RunSimJobs(ctx, jobs, progress)
	if err != nil {
		return err
	}
	for i := range results {
		results[i].Draw = jobs[i].Draw
	}
	fmt.Fprintf(w, "done in %.1fs\n\n", time.Since(start).Seconds())
	return finish(w, cfg, scenarios, results)
}

// floors computes each scenario's idle-engine floor (Floor) and adds what its
// trace offers the fleet in prefill and decode terms (describeLoad) to its
// description.
func floors(ctx context.Context, progress io.Writer, scenarios []Scenario, traces []workload.Trace) error {
	for i := range scenarios {
		s := &scenarios[i]
		start := time.Now()
		f, err := Floor(ctx, s.Fleet, traces[i])
		if err != nil {
			return fmt.Errorf("scenario %s: floor: %w", s.Name, err)
		}
		s.Floor = &f
		load, err := describeLoad(s.Fleet, s.Workload, traces[i], f.CachedShare)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		if load != "" {
			s.Description += " " + load
		}
		if progress != nil {
			fmt.Fprintf(progress, "  %-16s idle-engine floor: TTFT p95 %.1f ms  p99 %.1f ms  (%.1fs)\n", s.Name, f.P95ms, f.P99ms, time.Since(start).Seconds())
		}
	}
	return nil
}

// counted numbers the lines written through it, one a finished job, as
// done/total.
type counted struct {
	mu          sync.Mutex
	w           io.Writer
	done, total int
}

func (c *counted) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done++
	if _, err := fmt.Fprintf(c.w, "[%*d/%d] %s", len(strconv.Itoa(c.total)), c.done, c.total, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// selectScenarios returns the scenarios to run with their traces: the suite's
// (generated), or a replayed trace on a fleet file.
func selectScenarios(cfg Config) ([]Scenario, []workload.Trace, error) {
	if cfg.TraceFile != "" || cfg.FleetFile != "" {
		if cfg.TraceFile == "" || cfg.FleetFile == "" {
			return nil, nil, errors.New("--trace and --fleet go together")
		}
		tr, err := readTrace(cfg.TraceFile)
		if err != nil {
			return nil, nil, err
		}
		fs, err := simserver.LoadFleet(cfg.FleetFile)
		if err != nil {
			return nil, nil, err
		}
		s := Scenario{Scenario: report.Scenario{Name: "replay", Baseline: "round-robin",
			Description: fmt.Sprintf("Trace %s (%d requests) on the fleet of %s.", cfg.TraceFile, len(tr), cfg.FleetFile)}, Fleet: fs}
		return []Scenario{s}, []workload.Trace{tr}, nil
	}
	suite := cfg.Suite
	if suite == "" {
		suite = "aws"
	}
	all, err := Suite(suite, cfg.Quick)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, s := range all {
		names = append(names, s.Name)
	}
	for _, want := range cfg.Scenarios {
		if !slices.Contains(names, want) {
			return nil, nil, fmt.Errorf("unknown scenario %q (known: %s)", want, strings.Join(names, ", "))
		}
	}
	var out []Scenario
	var traces []workload.Trace
	for _, s := range all {
		if len(cfg.Scenarios) > 0 && !slices.Contains(cfg.Scenarios, s.Name) {
			continue
		}
		if cfg.Seed != 0 {
			s.Workload.Seed += cfg.Seed
		}
		tr, err := workload.Generate(s.Workload)
		if err != nil {
			return nil, nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
		s.Description += " Workload: " + workload.Describe(s.Workload) + "."
		out = append(out, s)
		traces = append(traces, tr)
	}
	return out, traces, nil
}

func readTrace(path string) (workload.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	tr, err := workload.Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(tr) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return tr, nil
}

func saveTraces(cfg Config, scenarios []Scenario, traces []workload.Trace) error {
	if !cfg.SaveTraces || cfg.Out == "" {
		return nil
	}
	dir := filepath.Join(cfg.Out, "traces")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, s := range scenarios {
		f, err := os.Create(filepath.Join(dir, s.Name+".jsonl"))
		if err != nil {
			return err
		}
		err = workload.Write(f, traces[i])
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing trace of %s: %w", s.Name, err)
		}
	}
	return nil
}

// finish prints the summary and writes the report.
func finish(w io.Writer, cfg Config, scenarios []Scenario, results []report.Result) error {
	meta := make([]report.Scenario, len(scenarios))
	for i, s := range scenarios {
		meta[i] = s.Scenario
	}
	report.Summary(w, meta, results)
	if cfg.Out == "" {
		return nil
	}
	header := fmt.Sprintf("Command: `%s`. Seed %d. Generated %s.", cfg.CommandLine, cfg.Seed, time.Now().UTC().Format(time.RFC3339))
	if err := report.WriteDoc(cfg.Out, meta, results, report.Doc{Header: header, Policies: PolicyDescriptions}); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nreport: %s  results: %s  plots: %s\n", filepath.Join(cfg.Out, "report.md"),
		filepath.Join(cfg.Out, "results.json"), filepath.Join(cfg.Out, "plots"))
	return nil
}
