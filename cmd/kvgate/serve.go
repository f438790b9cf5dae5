package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/kube"
	"github.com/kvgate/kvgate/internal/tracing"
)

func newServeCmd() *cobra.Command {
	var (
		o                   host.Options
		gw                  gateway.Options
		logLevel, logFormat string
		igwc, kubeconfig    string
		lease               leaseFlags
		obs                 observeFlags
		admin               adminFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: one OpenAI endpoint in front of pools of model servers",
		Long: `Reads an InferenceGatewayConfig document and serves the OpenAI API on --listen, routing each
request by its model to a pool of model servers and streaming the response back. Metrics, health
and debug endpoints are on --admin-listen. The configuration reloads on SIGHUP and when its file
changes; a file that fails validation is reported and the previous configuration keeps serving.

In Kubernetes, --igwc NAMESPACE/NAME serves an InferenceGatewayConfig resource instead: its
schedulers' modelSelector (or poolRef to an InferencePool) picks the model-server pods, ready
pods become endpoints as they come and go, and the resource's status reports what is served.`,
		Example: `  kvgate serve --config deploy/examples/gateway.yaml
  kvgate serve --igwc default/kvgate          # in a cluster (or with --kubeconfig)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = newLoggerFormat(logLevel, logFormat)
			if err := o.Core.SharedState.Validate(); err != nil {
				return err
			}
			tp, al, stop, err := obs.setup(cmd.Context(), tracing.DefaultServiceName, logFormat, o.Logger)
			if err != nil {
				return err
			}
			defer stop()
			gw.Tracing, gw.AccessLog, gw.Logger = tp, al, o.Logger
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			o.Reload = hup
			if igwc != "" {
				if o.ConfigPath != "" {
					return errors.New("--config and --igwc are exclusive")
				}
				src, err := kubeSource(igwc, kubeconfig, lease.options(o.Core.SharedState), o.Logger)
				if err != nil {
					return err
				}
				o.Source = src
			} else if o.ConfigPath == "" {
				return errors.New("--config FILE or --igwc NAMESPACE/NAME is required")
			}
			if o.Core.Admin, err = admin.options(kubeconfig, o.Logger); err != nil {
				return err
			}
			o.Core.ListenerTLS = true
			o.Front = func(_ context.Context, h *host.Host) (host.Front, error) {
				return h.HTTP(gateway.New(h.Router(), gw)), nil
			}
			return host.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigPath, "config", "", "InferenceGatewayConfig file (this or --igwc is required)")
	f.StringVar(&o.Listen, "listen", ":8080", "address of the OpenAI API")
	f.StringVar(&o.AdminListen, "admin-listen", ":9090", "address of /metrics, /healthz, /readyz and /debug")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 30*time.Second, "how long in-flight requests may finish after a stop signal (then they end with an explicit error)")
	f.DurationVar(&o.PreStop, "pre-stop", 5*time.Second, "after a stop signal, how long the API keeps accepting (with /readyz failing) before the drain")
	f.DurationVar(&gw.BodyReadTimeout, "body-read-timeout", time.Minute, "how long a client may take to send its request body")
	f.IntVar(&o.Core.DecisionLogEvery, "decision-log-every", 100, "at --log-level debug, log one routing decision in this many with every candidate's scores")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&igwc, "igwc", "", "serve this InferenceGatewayConfig (NAMESPACE/NAME) from the cluster instead of --config")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --igwc or --admin-auth kubernetes: kubeconfig file (default: in-cluster, then $KUBECONFIG)")
	lease.register(f)
	sharedStateFlags(f, &o.Core.SharedState)
	admin.register(f)
	obs.register(f, true)
	return cmd
}

// adminFlags secure the admin listener.
type adminFlags struct {
	auth, tokenFile string
	metrics, pprof  bool
	hosts           []string
}

func (a *adminFlags) register(f *pflag.FlagSet) {
	f.StringVar(&a.auth, "admin-auth", host.AdminAuthNone, "who may read /debug/* on --admin-listen: none (loopback clients only), token (the bearer token in --admin-token-file) or kubernetes (bearer tokens reviewed by the API server: TokenReview, then SubjectAccessReview of get on the path)")
	f.StringVar(&a.tokenFile, "admin-token-file", "", "with --admin-auth token: file holding the token, reread when it changes")
	f.BoolVar(&a.metrics, "admin-auth-metrics", true, "with --admin-auth token or kubernetes: /metrics wants the same authentication (/healthz, /readyz and /summary never do)")
	f.BoolVar(&a.pprof, "admin-pprof", false, "serve Go's profiler on /debug/pprof/ (behind --admin-auth)")
	f.StringSliceVar(&a.hosts, "admin-host", nil, "names, besides localhost and IP addresses, that the Host header of /ui/ and /debug/* may carry (e.g. the admin Service's DNS names)")
}

// options are the host's admin options; kubernetes reviews tokens through
// the cluster kubeconfig names (in-cluster by default).
func (a *adminFlags) options(kubeconfig string, log *slog.Logger) (host.AdminOptions, error) {
	o := host.AdminOptions{Auth: a.auth, TokenFile: a.tokenFile, Metrics: a.metrics, Pprof: a.pprof, Hosts: a.hosts}
	if a.auth == host.AdminAuthKubernetes {
		cfg, err := restConfig(kubeconfig, log)
		if err != nil {
			return o, fmt.Errorf("--admin-auth kubernetes: %w", err)
		}
		o.Kube = cfg
	}
	return o, nil
}

// sharedStateFlags registers the flags that link a replica to its peers.
func sharedStateFlags(f *pflag.FlagSet, o *host.SharedStateOptions) {
	f.StringVar(&o.Redis, "shared-state-redis", "", "share routing state with the other replicas through this Redis (host:port; overrides spec.gateway.sharedState.redis; credentials from $"+host.EnvSharedStateUsername+" and $"+host.EnvSharedStatePassword+")")
	f.StringVar(&o.Cluster, "shared-state-cluster", "", "the identity the replicas that share state have in common (default: spec.gateway.sharedState.cluster, else the configuration's namespace/name)")
	f.StringVar(&o.Replica, "replica-name", "", "this replica's name among its peers and as the status Lease's holder (default: $POD_NAME, else the host name with a random suffix)")
}

// leaseFlags say how the replicas share the status Lease (--igwc).
type leaseFlags struct {
	elect    bool
	duration time.Duration
}

func (l *leaseFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&l.elect, "leader-elect", true, "with --igwc: only the elected replica writes status (all replicas serve)")
	f.DurationVar(&l.duration, "lease-duration", kube.DefaultLeaseDuration, "with --igwc: how long the status Lease holds without renewal: a killed holder's status goes unwritten this long (graceful stops hand over at once); shorter means more Lease renewals and a holder losing it to a slow API server sooner (at least "+kube.MinLeaseDuration.String()+")")
}

// options are the kube options the flags set; the Lease holder is the replica's name.
func (l leaseFlags) options(s host.SharedStateOptions) kube.Options {
	return kube.Options{LeaderElection: l.elect, LeaseDuration: l.duration, Identity: s.Replica}
}

// kubeSource connects to the cluster and returns the gateway's configuration
// source for the named InferenceGatewayConfig.
func kubeSource(igwc, kubeconfig string, ko kube.Options, log *slog.Logger) (func(context.Context, *host.Host) error, error) {
	ns, name, ok := strings.Cut(igwc, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--igwc %q: want NAMESPACE/NAME", igwc)
	}
	if err := kube.ValidateLeaseDuration(ko.LeaseDuration); err != nil {
		return nil, err
	}
	cfg, err := restConfig(kubeconfig, log)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, g *host.Host) error {
		ko.Target, ko.Gateway, ko.Log = types.NamespacedName{Namespace: ns, Name: name}, g, log
		return kube.Start(ctx, cfg, ko)
	}, nil
}

// restConfig loads the cluster's client configuration: the kubeconfig file,
// else in-cluster, else $KUBECONFIG. It routes the Kubernetes libraries' logs to
// log.
func restConfig(kubeconfig string, log *slog.Logger) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	kube.SetLoggers(log)
	return cfg, nil
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
