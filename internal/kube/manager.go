package kube

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
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
// with LeaderElection only the leader writes status.
func Start(ctx context.Context, cfg *rest.Config, o Options) error {
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"}, // kvgate serves its own
		HealthProbeBindAddress:  "0",
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        "kvgate-status-" + o.Target.Name,
		LeaderElectionNamespace: o.Target.Namespace,
		// Only the target's namespace is watched: least privilege, and a cache no
		// larger than the namespace's pods.
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{o.Target.Namespace: {}}},
		Controller: config.Controller{SkipNameValidation: ptr(true)},
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	_, poolErr := mgr.GetRESTMapper().RESTMapping(InferencePoolGVK.GroupKind(), InferencePoolGVK.Version)
	r := &Reconciler{Client: mgr.GetClient(), Target: o.Target, Gateway: o.Gateway, Log: o.Log, Pools: poolErr == nil}
	if o.LeaderElection {
		r.Elected = mgr.Elected()
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	o.Log.Info("watching the cluster", "config", o.Target, "inferencePools", r.Pools, "leaderElection", o.LeaderElection)
	return mgr.Start(ctx)
}

// controllerOptions makes the controller run on every replica, leader or not:
// serving must not wait for an election.
func controllerOptions(needLeader *bool) controller.Options {
	return controller.Options{NeedLeaderElection: needLeader}
}

func ptr[T any](v T) *T { return &v }
