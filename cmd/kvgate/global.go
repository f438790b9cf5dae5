package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/global"
)

func newGlobalCmd() *cobra.Command {
	var (
		o                   global.ServerOptions
		path                string
		logLevel, logFormat string
		kubeconfig          string
		obs                 observeFlags
		admin               adminFlags
	)
	cmd := &cobra.Command{
		Use:   "global",
		Short: "Run the tier-2 global router over member clusters (tier-1 kvgate serve gateways)",
		Long: `Reads a GlobalRouterConfig document and serves the OpenAI API on --listen in front of member
clusters, each a tier-1 'kvgate serve'. It reads every member's load summary (GET /summary on the
member's admin listener) as its heartbeat, sends each request to the cheapest healthy member whose
predicted time to first token stays inside the SLO (spilling to dearer members as it would not),
fails over to the next member when one fails before streaming, ramps returning members up
gradually, authenticates API keys or JWTs, and enforces per-tenant and per-model limits shared by
all replicas through Redis. Metrics, health, /debug/members and /debug/config are on
--admin-listen, the debug pages behind --admin-auth as kvgate serve's. The configuration reloads on SIGHUP and when its file changes: members keep their
health across a reload unless their URLs change, requests under way finish under the configuration
they started with, and a file that fails validation is reported while the previous one keeps
serving.`,
		Example: `  kvgate global --config deploy/examples/global.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.ConfigPath = path
			o.Router.Logger = newLoggerFormat(logLevel, logFormat)
			var err error
			if o.Router.Admin, err = admin.options(kubeconfig, o.Router.Logger); err != nil {
				return err
			}
			tp, al, stop, err := obs.setup(cmd.Context(), "kvgate-global", logFormat, o.Router.Logger)
			if err != nil {
				return err
			}
			defer stop()
			o.Router.Tracing, o.Router.AccessLog = tp, al
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			o.Reload = hup
			return global.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "config", "", "GlobalRouterConfig file (required)")
	_ = cmd.MarkFlagRequired("config")
	f.StringVar(&o.Listen, "listen", ":8080", "address of the OpenAI API")
	f.StringVar(&o.AdminListen, "admin-listen", ":9090", "address of /metrics, /healthz, /readyz, /debug/config and /debug/members")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 30*time.Second, "how long in-flight requests may finish after a stop signal (then they end with an explicit error)")
	f.DurationVar(&o.PreStop, "pre-stop", 5*time.Second, "after a stop signal, how long the API keeps accepting (with /readyz failing) before the drain")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --admin-auth kubernetes: kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	admin.register(f)
	obs.register(f, true)
	return cmd
}
