package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/schedule"
)

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare routing policies on simulated or live model servers",
		Long: `Runs scenarios under routing policies and reports TTFT, inter-token latency, end-to-end
latency, throughput and prefix-cache hits per policy, with the change against round-robin.

--mode sim (the default) replays each scenario's trace in virtual time against simulated
engines, routed by the same picker, prefix index and in-flight accounting as kvgate serve,
with metric scrapes every 50 ms. --mode live sends the trace as real streaming requests to
one or more OpenAI-compatible targets, open loop.

--suite tenants sweeps 150 tenants' 6,000-token system prompts on 8 H100s from 70% to 120% of
the fleet's time (many-tenants-70 ... many-tenants-120).

--suite replicas runs six of the scenarios (shared-prefix, many-tenants-100, burst-at-once,
burst-three-speeds, mixed-gpu-stable, uniform-steady) behind --replicas gateway replicas
(default 1,2,4,8), each replica with its own picker, prefix index and dispatch accounting,
clients spread over them as a Kubernetes Service spreads connections; each count above one
with and without shared state. Shared, a replica
applies its peers' decisions to its prefix index --sync-delay after they were sent, and their
loads on each endpoint, which each publishes every --sync-every (0: at each change, gathered
within 2ms of its last send as kvgate's shared state gathers them), as they were --sync-delay
earlier. It reports per count the prefix hit rate, TTFT P50/P95/P99 and the
most requests one endpoint had in flight, against one replica, with --policies (default chat)
and least-request at one replica for reference; at the most replicas, other delays, and on
mixed fleets chat-fixed-speed, to tell what the delay costs from what is not shared.

On a terminal, progress (each idle-engine floor and each finished run, numbered done/total)
goes to stderr; when stderr is not a terminal, nothing does.

Examples:
  kvgate bench --suite aws --out bench-out
  kvgate bench --suite aws --quick --scenario mixed-gpu --policies round-robin,kvgate
  kvgate bench --suite mixed --quick --policies least-request,chat,oracle
  kvgate bench --suite tenants --quick --policies least-request,kvgate,oracle
  kvgate bench --suite replicas --out docs/results/replicas-sim
  kvgate bench --suite replicas --quick --scenario shared-prefix --replicas 1,8 --sync-delay 1ms
  kvgate bench --trace trace.jsonl --fleet deploy/examples/sim-fleet.yaml
  kvgate bench --mode live --scenario mixed-gpu --requests 500 --rate 5 \
      --target nginx=http://127.0.0.1:8201 --target kvgate=http://127.0.0.1:8203`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.CommandLine = "kvgate " + strings.Join(os.Args[1:], " ")
			cfg.Progress = progress(cmd.ErrOrStderr())
			return bench.Run(cmd.Context(), cmd.OutOrStdout(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Mode, "mode", "sim", "sim (virtual time) or live (real HTTP)")
	f.StringVar(&cfg.Suite, "suite", "aws", "scenario suite: "+strings.Join(bench.Suites, ", "))
	f.StringSliceVar(&cfg.Scenarios, "scenario", nil, "run only these scenarios of the suite (repeatable or comma-separated)")
	f.StringSliceVar(&cfg.Policies, "policies", nil, "policies to compare in sim mode (default: all: "+strings.Join(bench.Policies, ",")+"; --suite replicas: chat)")
	f.BoolVar(&cfg.Quick, "quick", false, "a tenth of each workload, for CI")
	f.IntVar(&cfg.Draws, "draws", 0, "runs of each randomised policy (kube-proxy), shown as their median and range (default: the policy's)")
	f.StringVar(&cfg.Out, "out", "", "directory for results.json, report.md and plots/")
	f.Uint64Var(&cfg.Seed, "seed", 0, "added to every scenario's workload seed")
	f.StringVar(&cfg.TraceFile, "trace", "", "replay this JSONL trace (with --fleet) instead of the suite")
	f.StringVar(&cfg.FleetFile, "fleet", "", "fleet file (as for kvgate sim) the trace runs on in sim mode")
	f.BoolVar(&cfg.SaveTraces, "save-traces", false, "write each scenario's trace to OUT/traces/<scenario>.jsonl")
	f.IntSliceVar(&cfg.Replicas, "replicas", nil, "--suite replicas: gateway replica counts to run (default 1,2,4,8)")
	f.DurationVar(&cfg.SyncDelay, "sync-delay", bench.DefaultSyncDelay, "--suite replicas: how late shared state reaches the other replicas")
	f.DurationVar(&cfg.SyncEvery, "sync-every", bench.DefaultSyncEvery, "--suite replicas: how often a replica publishes its loads (0: at each change, gathered as the live replicas gather them)")
	f.StringArrayVar(&cfg.Live.Targets, "target", nil, "live mode: NAME=URL of an OpenAI-compatible endpoint (repeatable; the first is the baseline)")
	f.IntVar(&cfg.Live.Requests, "requests", 0, "live mode: send at most this many requests of the trace")
	f.Float64Var(&cfg.Live.Rate, "rate", 0, "live mode: rescale the trace to this mean rate (requests/s)")
	f.DurationVar(&cfg.Live.Timeout, "timeout", 0, "live mode: bound of one request (default 5m)")
	f.IntVar(&cfg.Live.MaxConcurrency, "max-concurrency", 0, "live mode: requests in flight at most (default 4096)")
	f.DurationVar(&cfg.Live.Pause, "pause", 0, "live mode: pause between targets (default 5s)")
	f.IntVar(&cfg.Live.MaxTokens, "max-tokens", 0, "live mode: cap every request's output tokens (shorter runs)")
	return cmd
}

func newTuneCmd() *cobra.Command {
	var cfg bench.TuneConfig
	var perScenario bool
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "Search scorer weights in virtual time for a trace and fleet",
		Long: `Replays a trace on a fleet in virtual time under many weight settings (coordinate
descent over each scorer's weight) and prints the best weights, their gain over the starting
profile on the same trace, and a weights block ready to paste into a scheduler. On a terminal,
a line per evaluated setting goes to stderr.

Scorers searched (the others score every simulated endpoint alike):
` + tunedScorers() + `
Examples:
  kvgate tune --trace trace.jsonl --fleet fleet.yaml --objective p95-ttft
  kvgate tune --suite aws --quick --objective p95-e2e --profile batch
  kvgate tune --suite mixed --quick --per-scenario`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.TraceFile == "" && cfg.FleetFile == "" && cfg.Suite == "" {
				cfg.Suite = "aws"
			}
			cfg.Progress = progress(cmd.ErrOrStderr())
			if perScenario {
				_, err := bench.TunePerScenario(cmd.Context(), cmd.OutOrStdout(), cfg)
				return err
			}
			_, err := bench.Tune(cmd.Context(), cmd.OutOrStdout(), cfg)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.TraceFile, "trace", "", "JSONL trace to tune on (with --fleet)")
	f.StringVar(&cfg.FleetFile, "fleet", "", "fleet file (as for kvgate sim)")
	f.StringVar(&cfg.Suite, "suite", "", "tune over a suite's scenarios instead ("+strings.Join(bench.Suites, ", ")+")")
	f.StringSliceVar(&cfg.Scenarios, "scenario", nil, "with --suite: only these scenarios")
	f.BoolVar(&cfg.Quick, "quick", false, "with --suite: a tenth of each workload")
	f.StringVar(&cfg.Objective, "objective", "p95-ttft", "p95-ttft, p99-ttft, p50-ttft, p95-e2e or throughput")
	profiles := schedule.ProfileNames()
	f.StringVar(&cfg.Profile, "profile", string(profiles[0]), fmt.Sprintf("profile to start from and to compare against %v", profiles))
	f.BoolVar(&cfg.Spreads, "spreads", false, "also search the queue and running spreads (profile design)")
	f.BoolVar(&perScenario, "per-scenario", false, "with --suite: tune each scenario on its own and show how far the profile is from each one's best weights")
	f.Uint64Var(&cfg.Seed, "seed", 0, "added to every workload seed")
	return cmd
}

// tunedScorers lists the scorers kvgate tune searches, a line each with what
// the scorer prefers.
func tunedScorers() string {
	var b strings.Builder
	for _, s := range bench.TunedScorers() {
		fmt.Fprintf(&b, "  %-17s %s\n", s.Name, s.Description)
	}
	return b.String()
}

// progress is where a long command reports progress: stderr when it is a
// terminal, nothing otherwise (a log or a pipe keeps only the results).
func progress(stderr io.Writer) io.Writer {
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return f
	}
	return nil
}
