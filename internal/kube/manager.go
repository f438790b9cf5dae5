package kube

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	poolv1 "github.com/kvgate/kvgate/api/inferencepool/v1"
	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// Options configure Start.
type Options struct {
	Target  types.NamespacedName // the InferenceGatewayConfig to serve
	Gateway Applier
	Log     *slog.Logger
	// LeaderElection gates status writes (not serving) on a Lease named after the
	// target, so that several replicas do not fight over status.
	LeaderElection bool
	// LeaseDuration is how long the status Lease holds without renewal
	// (default DefaultLeaseDuration): how long status stays unwritten after
	// its holder dies without releasing it. See ValidateLeaseDuration.
	LeaseDuration time.Duration
	// Identity is the Lease holder's name: the replica's name (default
	// $POD_NAME, else the host name with a random suffix). Two live replicas
	// must not share it: each would take the other's Lease for its own.
	Identity string
	// PoolPollInterval overrides PoolPollInterval (tests).
	PoolPollInterval time.Duration
}

// DefaultLeaseDuration is client-go's and controller-runtime's default: a
// killed holder's status goes unwritten this long (plus up to a retry period).
// Graceful stops release the Lease at once.
const DefaultLeaseDuration = 15 * time.Second

// MinLeaseDuration keeps the renewal deadline (two thirds of the Lease) well
// above the retry period: an API server answering in a second must not cost
// the Lease.
const MinLeaseDuration = 3 * time.Second

// leaseRetry is how often a standby replica tries to take the Lease.
const leaseRetry = 500 * time.Millisecond

// ValidateLeaseDuration checks a --lease-duration.
func ValidateLeaseDuration(d time.Duration) error {
	if d != 0 && d < MinLeaseDuration {
		return fmt.Errorf("--lease-duration %v: at least %v (the holder renews it every %v, and must fit a slow API server's answer in between)", d, MinLeaseDuration, leaseRetry)
	}
	return nil
}

// StatusWriteFailuresMetric counts the status writes the API server refused.
const StatusWriteFailuresMetric = "kvgate_status_write_failures_total"

// statusWriteFailures registers (or finds, on a second Start in one process)
// the counter of refused status writes on the gateway's registry.
func statusWriteFailures(gw Applier) (*prometheus.CounterVec, error) {
	m, ok := gw.(interface{ Metrics() *telemetry.Gateway })
	if !ok || m.Metrics() == nil {
		return nil, nil
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: StatusWriteFailuresMetric,
		Help: "Status writes of the InferenceGatewayConfig the API server refused, by its reason (Invalid, Forbidden, ...)."}, []string{"reason"})
	if err := m.Metrics().Registry.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("registering %s: %w", StatusWriteFailuresMetric, err)
	}
	return c, nil
}

// SetLoggers routes controller-runtime's and client-go's (klog) logs to l. Both
// are process-wide, so it is called once, before Start.
func SetLoggers(l *slog.Logger) {
	log.SetLogger(toLogr(l))
	klog.SetLogger(toLogr(l))
}

// PoolPollInterval is how often kvgate asks discovery whether the API server
// serves the InferencePool resource, so that installing its CRD needs no
// restart and deleting it stops the watch (a failing pool watch also asks at
// once). Replicas therefore pick a returned CRD up within this much of each
// other.
const PoolPollInterval = 5 * time.Second

// Start runs the controller until ctx ends. Every replica watches and serves;
// with LeaderElection only the replica holding the Lease writes status and
// Events. Losing the Lease (an API server outage, say) only stops status
// writes: the replica keeps serving and campaigns again. controller-runtime's
// own election would stop the whole manager instead, so kvgate runs client-go's
// elector itself. Start returns once the Lease is released, so that the next
// replica takes status over at once.
func Start(ctx context.Context, cfg *rest.Config, o Options) error {
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100 // client-go's 5 QPS would throttle a rollout's pod events
	}
	// A failing InferencePool watch asks watchPools to look at discovery now.
	recheck := make(chan struct{}, 1)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"}, // kvgate serves its own
		HealthProbeBindAddress: "0",
		// Only the target's namespace is watched: least privilege, and a cache no
		// larger than the namespace's pods. The InferenceGatewayConfig is read
		// as an unstructured object, from the cache too.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{o.Target.Namespace: {}},
			DefaultWatchErrorHandler: poolWatchErrors(recheck)},
		Client:     client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Controller: config.Controller{SkipNameValidation: ptr(true)},
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var pools atomic.Bool
	installed, err := poolsServed(cs.Discovery())
	if err != nil {
		return fmt.Errorf("looking up the InferencePool resource: %w", err)
	}
	pools.Store(installed)
	if err := ValidateLeaseDuration(o.LeaseDuration); err != nil {
		return err
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	failures, err := statusWriteFailures(o.Gateway)
	if err != nil {
		return err
	}
	kick := make(chan event.GenericEvent, 1)
	r := &Reconciler{Client: mgr.GetClient(), Target: o.Target, Gateway: o.Gateway, Log: o.Log, Pools: pools.Load, kick: kick,
		Events: mgr.GetEventRecorder("kvgate"), StatusWriteFailures: failures}
	// The campaign ends with Start, however Start ends, and Start returns
	// once its Lease is released.
	electCtx, stopElect := context.WithCancel(ctx)
	var released <-chan struct{}
	defer func() {
		stopElect()
		if released == nil {
			return
		}
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			o.Log.Warn("the status lease was not released in 5s; the next replica takes status over when it expires")
		}
	}()
	if sink, ok := o.Gateway.(Certificates); ok && sink.ServesTLS() {
		r.secrets = &secretWatch{ctx: ctx, cs: cs, ns: o.Target.Namespace, sink: sink, log: o.Log, kick: func() { poke(kick) }}
	}
	if o.LeaderElection {
		var elected atomic.Bool
		r.Leader = elected.Load
		if released, err = campaign(electCtx, cs, o, &elected, kick); err != nil {
			return err
		}
	}
	c, err := r.SetupWithManager(mgr)
	if err != nil {
		return err
	}
	interval := o.PoolPollInterval
	if interval <= 0 {
		interval = PoolPollInterval
	}
	go watchPools(ctx, cs.Discovery(), interval, recheck, installed, o.Log, poolWatch{
		found: func() error {
			if err := c.Watch(source.Kind[client.Object](mgr.GetCache(), &poolv1.InferencePool{}, r.toTarget())); err != nil {
				return err
			}
			pools.Store(true)
			poke(kick)
			return nil
		},
		lost: func() error {
			// Under the reconcile lock, so that no reconcile reads pools from
			// the cache after the flag is down: a read would start the
			// informer again.
			r.mu.Lock()
			pools.Store(false)
			err := mgr.GetCache().RemoveInformer(ctx, &poolv1.InferencePool{})
			r.mu.Unlock()
			poke(kick)
			return err
		},
	})
	o.Log.Info("watching the cluster", "config", o.Target, "inferencePools", installed, "leaderElection", o.LeaderElection, "leaseDuration", o.LeaseDuration)
	return mgr.Start(ctx)
}

// poolsServed says whether the API server serves InferencePools.
func poolsServed(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(InferencePoolGVK.GroupVersion().String())
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	for _, res := range list.APIResources {
		if res.Kind == InferencePoolGVK.Kind {
			return true, nil
		}
	}
	return false, nil
}

// poolWatch starts and stops the InferencePool watch.
type poolWatch struct {
	found func() error // the resource appeared: watch it
	lost  func() error // the resource went: stop watching it
}

// watchPools follows the InferencePool resource through discovery until ctx
// ends, every interval and whenever recheck fires: it starts the watch when
// the resource appears and stops it when the resource goes (its CRD deleted),
// so that a missing resource costs one WARN line rather than an informer
// failing, and logging, until the CRD returns.
func watchPools(ctx context.Context, d discovery.DiscoveryInterface, every time.Duration, recheck <-chan struct{}, served bool, log *slog.Logger, w poolWatch) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-recheck:
		}
		ok, err := poolsServed(d)
		if err != nil {
			log.Debug("looking up the InferencePool resource", "err", err)
			continue
		}
		switch {
		case ok && !served:
			if err := w.found(); err != nil {
				log.Warn("the InferencePool resource appeared but cannot be watched; retrying", "err", err)
				continue
			}
			served = true
			log.Info("the InferencePool resource is installed; watching InferencePools")
		case !ok && served:
			served = false
			log.Warn("the API server no longer serves the InferencePool resource (its CRD was deleted): schedulers with a poolRef have no endpoints until it returns",
				"recheckEvery", every)
			if err := w.lost(); err != nil {
				log.Warn("stopping the InferencePool watch", "err", err)
			}
		}
	}
}

// poolWatchErrors is the cache's watch error handler. A pool watch refused
// as not found means the resource went: watchPools is asked to confirm it
// through discovery and stop the watch, instead of each retry logging an
// error. Every other error is client-go's to log.
func poolWatchErrors(recheck chan<- struct{}) toolscache.WatchErrorHandlerWithContext {
	poolType := reflect.TypeOf(&poolv1.InferencePool{}).String() // what the reflector names it
	return func(ctx context.Context, r *toolscache.Reflector, err error) {
		if r.TypeDescription() == poolType && apierrors.IsNotFound(err) {
			select {
			case recheck <- struct{}{}:
			default:
			}
			return
		}
		toolscache.DefaultWatchErrorHandler(ctx, r, err)
	}
}

// LeaseName is the status Lease of an InferenceGatewayConfig: a name of up to
// 253 characters like the config's, shortened with a hash of the whole when
// the prefix makes it longer, so that two configs never share one.
func LeaseName(config string) string {
	name := "kvgate-status-" + config
	if len(name) <= 253 {
		return name
	}
	sum := fnv.New64a()
	_, _ = sum.Write([]byte(config))
	return strings.TrimRight(name[:236], "-.") + "-" + fmt.Sprintf("%016x", sum.Sum64())
}

// poke queues one reconcile, unless one is queued already.
func poke(kick chan<- event.GenericEvent) {
	select {
	case kick <- event.GenericEvent{Object: &v1alpha1.InferenceGatewayConfig{}}:
	default:
	}
}

// campaign keeps trying to hold the status Lease until ctx ends, flipping
// elected; winning it re-runs the reconcile so that status is written at once.
// The returned channel closes once the elector has stopped and released the
// Lease.
func campaign(ctx context.Context, cs kubernetes.Interface, o Options, elected *atomic.Bool, kick chan<- event.GenericEvent) (<-chan struct{}, error) {
	id := o.Identity
	if id == "" {
		id = os.Getenv("POD_NAME") // the chart sets it, as it names the replica
	}
	if id == "" {
		host, _ := os.Hostname()
		id = host + "_" + rand.String(8)
	}
	name := LeaseName(o.Target.Name)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.Target.Namespace, name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, err
	}
	lease := o.LeaseDuration
	// A released Lease is taken at the next retry: 0.5–1.1 s (client-go adds
	// up to 1.2 × the period as jitter) after the previous holder stops; an
	// expired one (its holder killed) the same after the Lease's duration.
	// The holder gives up after two thirds of it without a renewal, as
	// client-go's defaults do (15 s and 10 s).
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: lease, RenewDeadline: lease * 2 / 3, RetryPeriod: leaseRetry,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				elected.Store(true)
				poke(kick)
			},
			OnStoppedLeading: func() { elected.Store(false) },
		},
	})
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			le.Run(ctx) // returns when the lease is lost, or released as ctx ends
			if ctx.Err() == nil {
				o.Log.Warn("lost the status lease; still serving, campaigning again", "lease", name)
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Second):
				}
			}
		}
	}()
	return done, nil
}

func ptr[T any](v T) *T { return &v }
