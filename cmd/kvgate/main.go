// Command kvgate is the GPU-aware gateway for LLM inference. Subcommands are wired
// here; their logic lives under internal/.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/internal/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvgate",
		Short:         "GPU-aware gateway for LLM inference",
		Long:          "kvgate routes OpenAI-compatible requests to the model-server pod best able to serve them,\nusing KV-cache, queue, LoRA and prefix-cache state scraped from every pod.",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return bindEnv(cmd)
		},
	}
	root.AddCommand(newVersionCmd(), newServeCmd(), newEPPCmd(), newGlobalCmd(), newSimCmd(), newDemoCmd(), newBenchCmd(), newTuneCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), buildinfo.String())
		},
	}
}

// bindEnv lets every flag be set from the environment as KVGATE_<FLAG>, with dashes
// as underscores (--max-loras ⇒ KVGATE_MAX_LORAS); the command line wins.
func bindEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "KVGATE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := cmd.Flags().Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", name, v, e)
			}
		}
	})
	return err
}
