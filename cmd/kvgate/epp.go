package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/certs"
	"github.com/kvgate/kvgate/internal/extproc"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/kube"
	"github.com/kvgate/kvgate/internal/telemetry"
)

func newEPPCmd() *cobra.Command {
	var (
		o                   host.Options
		xo                  extproc.Options
		healthListen        string
		logLevel, logFormat string
		igwc, kubeconfig    string
		bbr                 bool
		lease               leaseFlags
		bbrConfigMaps       string
		secure              bool
		certDir             string
		obs                 observeFlags
		admin               adminFlags
	)
	cmd := &cobra.Command{
		Use:   "epp",
		Short: "Run as an Envoy ext_proc Endpoint Picker (or, with --bbr, Body-Based Router)",
		Long: `Serves Envoy's external processing protocol (envoy.service.ext_proc.v3) on --listen, as the
Gateway API Inference Extension's Endpoint Picker: for each request Envoy streams the headers and
body (FULL_DUPLEX_STREAMED); kvgate reads the body only up to the model and the prompt's head, picks
an endpoint with the same scheduler as 'kvgate serve', and answers the x-gateway-destination-endpoint
header and envoy.lb metadata (the pick, and with --fallbacks N up to N fallbacks after it). Body
bytes pass through unchanged. gRPC health is on --health-listen, metrics on --admin-listen.

With --bbr it is the Body-Based Router instead: it copies the body's model into
X-Gateway-Model-Name (and an adapter's base model into X-Gateway-Base-Model-Name) and clears the
route cache, so that HTTPRoute header matches see them. Adapters come from --config's schedulers and,
with --bbr-configmaps, from ConfigMaps labelled inference.networking.k8s.io/bbr-managed=true.`,
		Example: `  kvgate epp --config deploy/examples/gateway.yaml
  kvgate epp --igwc default/kvgate                       # in a cluster
  kvgate epp --bbr --listen :9004 --health-listen :9005 --bbr-configmaps default`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLoggerFormat(logLevel, logFormat)
			o.Logger = log
			if err := o.Core.SharedState.Validate(); err != nil {
				return err
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			o.Reload = hup
			switch {
			case igwc != "" && o.ConfigPath != "":
				return errors.New("--config and --igwc are exclusive")
			case igwc != "":
				src, err := kubeSource(igwc, kubeconfig, lease.options(o.Core.SharedState), log)
				if err != nil {
					return err
				}
				o.Source = src
			case o.ConfigPath == "" && !bbr:
				return errors.New("--config FILE or --igwc NAMESPACE/NAME is required")
			case o.ConfigPath == "":
				// A body-based router needs no pools; its adapters may all come
				// from ConfigMaps.
				o.Source = func(ctx context.Context, _ *host.Host) error { <-ctx.Done(); return nil }
				o.Core.ReadyWithoutConfig = true
			}
			if bbr {
				xo.BBR = extproc.NewBBR()
				if cmd.Flags().Changed("bbr-configmaps") {
					cfg, err := restConfig(kubeconfig, log)
					if err != nil {
						return err
					}
					ns := bbrConfigMaps
					if ns == "*" {
						ns = ""
					}
					if err := kube.WatchAdapterConfigMaps(cmd.Context(), cfg, ns, log, xo.BBR.SetSource); err != nil {
						return err
					}
				}
			}
			if !bbr {
				tp, al, stop, err := obs.setup(cmd.Context(), "kvgate-epp", logFormat, log)
				if err != nil {
					return err
				}
				defer stop()
				xo.Tracing, xo.AccessLog = tp, al
			}
			var tlsConfig *tls.Config
			if secure {
				// The certificate's metrics join the gateway's on /metrics.
				metrics := telemetry.NewGateway()
				o.Core.Metrics = metrics
				cfg, err := extproc.ServingTLS(certDir, log, certs.NewMetrics(metrics.Registry))
				if err != nil {
					return err
				}
				tlsConfig = cfg
			}
			var err error
			if o.Core.Admin, err = admin.options(kubeconfig, log); err != nil {
				return err
			}
			xo.Logger = log
			o.Front = func(ctx context.Context, h *host.Host) (host.Front, error) {
				return extproc.Listen(ctx, extproc.New(h.Router(), xo), healthListen, tlsConfig)
			}
			return host.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigPath, "config", "", "InferenceGatewayConfig file (this or --igwc is required)")
	f.StringVar(&o.Listen, "listen", ":9002", "address of the ext_proc gRPC service")
	f.StringVar(&healthListen, "health-listen", ":9003", "address of the gRPC health service")
	f.StringVar(&o.AdminListen, "admin-listen", ":9090", "address of /metrics, /healthz, /readyz and /debug")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 30*time.Second, "how long streams in flight may finish after a stop signal")
	f.DurationVar(&o.PreStop, "pre-stop", 5*time.Second, "after a stop signal, how long the ext_proc listener keeps accepting (with /readyz failing) before the drain")
	f.IntVar(&xo.Fallbacks, "fallbacks", 0, "fallback endpoints after the pick in the destination header and metadata, for a data plane that retries down a comma-separated list (-1: maxAttempts-1 from the configuration); 0 sends one address, which an ORIGINAL_DST cluster needs")
	f.IntVar(&o.Core.DecisionLogEvery, "decision-log-every", 100, "at --log-level debug, log one routing decision in this many with every candidate's scores")
	f.BoolVar(&secure, "secure-serving", false, "serve ext_proc over TLS (gateways that dial the picker with TLS, such as Envoy AI Gateway, need it); health stays plaintext")
	f.StringVar(&certDir, "cert-path", "", "with --secure-serving: folder holding tls.crt and tls.key (default: a self-signed certificate made at startup)")
	f.BoolVar(&bbr, "bbr", false, "run as the Body-Based Router instead of the Endpoint Picker")
	f.StringVar(&bbrConfigMaps, "bbr-configmaps", "", "with --bbr: read adapter mappings from bbr-managed ConfigMaps in this namespace (* for all)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&igwc, "igwc", "", "serve this InferenceGatewayConfig (NAMESPACE/NAME) from the cluster instead of --config")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --igwc, --bbr-configmaps or --admin-auth kubernetes: kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	lease.register(f)
	sharedStateFlags(f, &o.Core.SharedState)
	admin.register(f)
	obs.register(f, true)
	return cmd
}
