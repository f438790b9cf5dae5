package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/sim"
)

func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated model servers (vLLM, SGLang or TensorRT-LLM look-alikes)",
	}
	cmd.AddCommand(newSimCalibrateCmd())
	return cmd
}

func newSimCalibrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "calibrate",
		Short: "Print the simulator's latency and throughput figures per GPU and model size",
		Long: "Measures, in virtual time, TTFT of 1k- and 4k-token prompts at batch 1, inter-token latency\n" +
			"at batch 1 and 64 (1k in, 256 out) and the output tokens/s of 1000 requests of 1k in / 256 out,\n" +
			"for each deployment docs/simulator.md compares with published vLLM figures.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(w, "gpu\tmodel\ttp\tTTFT 1k\tTTFT 4k\tITL b1\tITL b64\tpeak out tok/s\tKV blocks\t")
			for _, d := range sim.CalibrationDeployments {
				r, err := sim.Calibrate(d.GPU, d.ModelSize, d.TensorParallel)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.0f\t%d\t\n", r.GPU, r.ModelSize, r.TensorParallel,
					msStr(r.TTFT1k), msStr(r.TTFT4k), msStr(r.ITL1), msStr(r.ITL64), r.PeakOutputPerSec, r.KVBlocks)
			}
			return w.Flush()
		},
	}
}

func msStr(d time.Duration) string { return fmt.Sprintf("%.1f ms", d.Seconds()*1000) }
