package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/demo"
)

func newDemoCmd() *cobra.Command {
	var opts demo.Options
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the end-to-end demonstration on an embedded simulated fleet",
		Long: "Starts a simulated mixed fleet (2 H100 and 2 A10G servers of an 8B model) on loopback with\n" +
			"kvgate's gateway in front, sends real streaming OpenAI requests and reports latencies,\n" +
			"prefix-cache and LoRA behaviour, and what was served where under round-robin and under\n" +
			"kvgate's picker. No GPU needed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return demo.Run(cmd.Context(), cmd.OutOrStdout(), opts)
		},
	}
	// Nominal: the trace has rate × duration requests, and a bursty trace that
	// starts with a burst sends them sooner; the report gives the real figures.
	cmd.Flags().DurationVar(&opts.LoadDuration, "duration", 15*time.Second, "nominal length of each load phase (the trace has rate × duration requests)")
	cmd.Flags().Float64Var(&opts.Rate, "rate", 6, "mean requests per second over whole burst cycles in the load phases")
	cmd.Flags().Uint64Var(&opts.Seed, "seed", 1, "seed of the traffic (the trace's seed is this + 1)")
	cmd.Flags().StringVar(&opts.Out, "out", "demo-out", "directory for the load phase's report.md, results.json and plots (empty: none)")
	return cmd
}
