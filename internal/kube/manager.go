package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// Options configure Start.
type Options struct {
	Target  types.NamespacedName // the InferenceGatewayConfig to serve
	Gateway Applier
	Log     *slog.Logger
	// LeaderElection gates status writes (not serving) on a Lease named after the
	// target, so that several replicas do not fight over status.
	LeaderElection bool
}

// SetLoggers routes controller-runtime's and client-go's (klog) logs to l. Both
// are process-wide, so it is called once, before Start.
func SetLoggers(l *slog.Logger) {
	log.SetLogger(toLogr(l))
	klog.SetLogger(toLogr(l))
}

// Start runs the controller until ctx ends. Every replica watches and serves;
// with LeaderElection only the replica holding the Lease writes status. Losing
// the Lease (an API server outage, say) only stops status writes: the replica
// keeps serving and campaigns again. controller-runtime's own election would
// stop the whole manager instead, so kvgate runs client-go's elector itself.
func Start(ctx context.Context, cfg *rest.Config, o Options) error {
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100 // client-go's 5 QPS would throttle a rollout's pod events
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"}, // kvgate serves its own
		HealthProbeBindAddress: "0",
		// Only the target's namespace is watched: least privilege, and a cache no
		// larger than the namespace's pods. InferencePools are read as
		// unstructured objects, from the cache too.
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{o.Target.Namespace: {}}},
		Client:     client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Controller: config.Controller{SkipNameValidation: ptr(true)},
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	pools := true
	if _, err := mgr.GetRESTMapper().RESTMapping(InferencePoolGVK.GroupKind(), InferencePoolGVK.Version); err != nil {
		if !meta.IsNoMatchError(err) {
			return fmt.Errorf("looking up the InferencePool resource: %w", err)
		}
		pools = false
	}
	kick := make(chan event.GenericEvent, 1)
	r := &Reconciler{Client: mgr.GetClient(), Target: o.Target, Gateway: o.Gateway, Log: o.Log, Pools: pools, kick: kick}
	if o.LeaderElection {
		var elected atomic.Bool
		r.Leader = elected.Load
		if err := campaign(ctx, cfg, o, &elected, kick); err != nil {
			return err
		}
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	o.Log.Info("watching the cluster", "config", o.Target, "inferencePools", r.Pools, "leaderElection", o.LeaderElection)
	return mgr.Start(ctx)
}

// campaign keeps trying to hold the status Lease until ctx ends, flipping
// elected; winning it re-runs the reconcile so that status is written at once.
func campaign(ctx context.Context, cfg *rest.Config, o Options, elected *atomic.Bool, kick chan<- event.GenericEvent) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	name := "kvgate-status-" + o.Target.Name
	if len(name) > 63 {
		name = name[:63]
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.Target.Namespace, name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: host + "_" + rand.String(8)})
	if err != nil {
		return err
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				elected.Store(true)
				select {
				case kick <- event.GenericEvent{Object: &v1alpha1.InferenceGatewayConfig{}}:
				default:
				}
			},
			OnStoppedLeading: func() { elected.Store(false) },
		},
	})
	if err != nil {
		return err
	}
	go func() {
		for ctx.Err() == nil {
			le.Run(ctx) // returns when the lease is lost; campaign again
			if ctx.Err() == nil {
				o.Log.Warn("lost the status lease; still serving, campaigning again", "lease", name)
				time.Sleep(2 * time.Second)
			}
		}
	}()
	return nil
}

func ptr[T any](v T) *T { return &v }
