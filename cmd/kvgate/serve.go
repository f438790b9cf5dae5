package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/gateway"
)

func newServeCmd() *cobra.Command {
	var (
		o                   gateway.ServerOptions
		logLevel, logFormat string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: one OpenAI endpoint in front of pools of model servers",
		Long: `Reads an InferenceGatewayConfig document and serves the OpenAI API on --listen, routing each
request by its model to a pool of model servers and streaming the response back. Metrics, health
and debug endpoints are on --admin-listen. The configuration reloads on SIGHUP and when its file
changes; a file that fails validation is reported and the previous configuration keeps serving.`,
		Example: `  kvgate serve --config deploy/examples/gateway.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = newLoggerFormat(logLevel, logFormat)
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			o.Reload = hup
			return gateway.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigPath, "config", "", "InferenceGatewayConfig file (required)")
	f.StringVar(&o.Listen, "listen", ":8080", "address of the OpenAI API")
	f.StringVar(&o.AdminListen, "admin-listen", ":9090", "address of /metrics, /healthz, /readyz and /debug")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 30*time.Second, "how long in-flight requests may finish after a stop signal")
	f.DurationVar(&o.Gateway.BodyReadTimeout, "body-read-timeout", time.Minute, "how long a client may take to send its request body")
	f.IntVar(&o.Gateway.DecisionLogEvery, "decision-log-every", 100, "at --log-level debug, log one routing decision in this many with every candidate's scores")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func newLoggerFormat(level, format string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
