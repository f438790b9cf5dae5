// Package kube runs kvgate inside Kubernetes: it watches one
// InferenceGatewayConfig and the Pods (or InferencePools) its schedulers select,
// turns ready pods into endpoints, applies the result to the gateway, and reports
// status. Every replica reconciles and serves on its own; only the elected leader
// writes status.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// InferencePoolGVK is the upstream pool resource kvgate accepts as a pool source.
var InferencePoolGVK = schema.GroupVersionKind{Group: "inference.networking.k8s.io", Version: "v1", Kind: "InferencePool"}

// Applier is what the controller drives: the gateway.
type Applier interface {
	Apply(cfg *v1alpha1.InferenceGatewayConfig) error
	RecordRejected(err error)
}

// Reconciler keeps the gateway's configuration equal to the cluster's.
type Reconciler struct {
	Client  client.Client
	Target  types.NamespacedName // the InferenceGatewayConfig this gateway serves
	Gateway Applier
	Log     *slog.Logger
	// Leader says whether this replica may write status (leader election); nil
	// writes always.
	Leader func() bool
	// Pools says whether the InferencePool resource is installed.
	Pools bool
	// kick, when set, re-runs the reconcile on demand (on winning the Lease).
	kick <-chan event.GenericEvent

	mu       sync.Mutex
	lastGood *v1alpha1.InferenceGatewayConfig
	rejected bool // the last attempt was refused: the next good one is applied even if unchanged
}

// specError is a problem with the configuration itself, reported in status
// rather than retried.
type specError struct{ error }

// Scheme returns a scheme with the core types and kvgate's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// SetupWithManager registers the reconciler: the config itself, and any Pod or
// InferencePool in its namespace, trigger a reconcile of the one config.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toTarget := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if o.GetNamespace() != r.Target.Namespace {
			return nil
		}
		return []reconcile.Request{{NamespacedName: r.Target}}
	})
	// Status writes bump the resource version but not the generation: only spec
	// changes (and pods) need a reconcile.
	b := ctrl.NewControllerManagedBy(mgr).
		Named("kvgate").
		For(&v1alpha1.InferenceGatewayConfig{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Pod{}, toTarget).
		// Every replica reconciles: serving must not wait for an election.
		WithOptions(controller.Options{NeedLeaderElection: ptr(false)})
	if r.Pools {
		pool := &unstructured.Unstructured{}
		pool.SetGroupVersionKind(InferencePoolGVK)
		b = b.Watches(pool, toTarget)
	}
	if r.kick != nil {
		b = b.WatchesRawSource(source.Channel(r.kick, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: r.Target}}
		})))
	}
	return b.Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.NamespacedName != r.Target {
		return reconcile.Result{}, nil
	}
	var cfg v1alpha1.InferenceGatewayConfig
	if err := r.Client.Get(ctx, r.Target, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			r.Log.Warn("InferenceGatewayConfig not found; the last configuration keeps serving", "config", r.Target)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	status := v1alpha1.InferenceGatewayConfigStatus{ObservedGeneration: cfg.Generation}
	resolved, perScheduler, err := r.resolve(ctx, &cfg)
	var spec specError
	if err != nil && !errors.As(err, &spec) {
		return reconcile.Result{}, err // the API server's trouble: retried with backoff
	}
	if err == nil {
		r.mu.Lock()
		same := r.lastGood != nil && !r.rejected && equality.Semantic.DeepEqual(r.lastGood.Spec, resolved.Spec)
		r.mu.Unlock()
		// An event that changes nothing the gateway serves (another pod in the
		// namespace, a status write) must not rebuild pools and transports.
		if !same {
			err = r.Gateway.Apply(resolved)
		}
	}
	if err != nil {
		r.mu.Lock()
		r.rejected = true
		r.mu.Unlock()
		r.Gateway.RecordRejected(err)
		r.Log.Error("configuration rejected; the last good one keeps serving", "config", r.Target, "err", err)
		ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NothingServing", Message: "no configuration has been accepted yet; fix the spec"}
		if r.hasLastGood() {
			ready = metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "LastGoodServing", Message: "the last accepted configuration keeps serving; fix the spec to apply a new one"}
		}
		status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Invalid", Message: trim(err.Error())}, ready}
		return reconcile.Result{}, r.writeStatus(ctx, &cfg, status)
	}
	r.mu.Lock()
	r.lastGood, r.rejected = resolved, false
	r.mu.Unlock()
	status.Schedulers = perScheduler
	status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", Message: "the configuration is valid and serving"}}
	var empty []string
	for _, s := range perScheduler {
		if s.Endpoints == 0 {
			empty = append(empty, s.Name)
		}
	}
	if len(empty) == 0 {
		status.Conditions = append(status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "EndpointsReady", Message: "every scheduler has ready endpoints"})
	} else {
		msgs := make([]string, 0, len(empty))
		for _, n := range empty {
			msgs = append(msgs, n+": "+schedulerCondition(perScheduler, n))
		}
		status.Conditions = append(status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoReadyEndpoints", Message: trim(strings.Join(msgs, "; "))})
	}
	return reconcile.Result{}, r.writeStatus(ctx, &cfg, status)
}

func (r *Reconciler) hasLastGood() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastGood != nil
}

// resolve fills each scheduler's endpoints from the ready pods it selects and
// reports per-scheduler status.
func (r *Reconciler) resolve(ctx context.Context, cfg *v1alpha1.InferenceGatewayConfig) (*v1alpha1.InferenceGatewayConfig, []v1alpha1.SchedulerStatus, error) {
	out := cfg.DeepCopy()
	var statuses []v1alpha1.SchedulerStatus
	for i := range out.Spec.Schedulers {
		sc := &out.Spec.Schedulers[i]
		if sc.ModelSelector == nil && sc.PoolRef == "" {
			statuses = append(statuses, v1alpha1.SchedulerStatus{Name: sc.Name, Endpoints: int32(len(sc.Endpoints)), RolloutState: "Available"})
			continue
		}
		sel, port, err := r.selectorOf(ctx, cfg.Namespace, sc)
		if err != nil {
			var spec specError
			if errors.As(err, &spec) {
				return nil, nil, specError{fmt.Errorf("spec.schedulers[%d] (%s): %w", i, sc.Name, err)}
			}
			return nil, nil, err
		}
		var pods corev1.PodList
		if err := r.Client.List(ctx, &pods, client.InNamespace(cfg.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil, nil, err
		}
		ready, total := []string{}, 0
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			total++
			if podReady(p) && p.Status.PodIP != "" {
				ready = append(ready, hostPort(p.Status.PodIP, port))
			}
		}
		sort.Strings(ready)
		// The pool's endpoints come from the cluster only.
		sc.Endpoints = slices.Compact(ready)
		st := v1alpha1.SchedulerStatus{Name: sc.Name, Endpoints: int32(len(sc.Endpoints))}
		switch {
		case total == 0:
			st.RolloutState = "Pending"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoMatchingPods",
				Message: fmt.Sprintf("no pod in namespace %s matches selector %q", cfg.Namespace, sel.String())}}
		case len(ready) == 0:
			st.RolloutState = "Degraded"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoReadyPods",
				Message: fmt.Sprintf("%d pods match selector %q, none is ready with an IP", total, sel.String())}}
		case len(ready) < total:
			st.RolloutState = "Progressing"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "SomePodsReady",
				Message: fmt.Sprintf("%d of %d matching pods ready", len(ready), total)}}
		default:
			st.RolloutState = "Available"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "PodsReady",
				Message: fmt.Sprintf("%d matching pods ready", total)}}
		}
		statuses = append(statuses, st)
	}
	return out, statuses, nil
}

// selectorOf returns a scheduler's pod selector and target port, from its own
// fields or from the InferencePool it names.
func (r *Reconciler) selectorOf(ctx context.Context, ns string, sc *v1alpha1.SchedulerSpec) (labels.Selector, int, error) {
	if sc.PoolRef == "" {
		sel, err := metav1.LabelSelectorAsSelector(sc.ModelSelector)
		if err != nil {
			return nil, 0, specError{fmt.Errorf("modelSelector: %w", err)}
		}
		if sel.Empty() {
			return nil, 0, specError{errors.New("modelSelector selects every pod; give it labels")}
		}
		return sel, sc.Port(), nil
	}
	if !r.Pools {
		return nil, 0, specError{fmt.Errorf("poolRef %q: the InferencePool resource (inference.networking.k8s.io/v1) was not installed when kvgate started", sc.PoolRef)}
	}
	pool := &unstructured.Unstructured{}
	pool.SetGroupVersionKind(InferencePoolGVK)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: sc.PoolRef}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, 0, specError{fmt.Errorf("poolRef %q: no InferencePool of that name in namespace %s", sc.PoolRef, ns)}
		}
		return nil, 0, fmt.Errorf("poolRef %q: %w", sc.PoolRef, err)
	}
	ml, _, err := unstructured.NestedStringMap(pool.Object, "spec", "selector", "matchLabels")
	if err != nil || len(ml) == 0 {
		return nil, 0, specError{fmt.Errorf("InferencePool %q has no spec.selector.matchLabels", sc.PoolRef)}
	}
	ports, _, _ := unstructured.NestedSlice(pool.Object, "spec", "targetPorts")
	port := sc.Port()
	if len(ports) > 0 {
		if m, ok := ports[0].(map[string]any); ok {
			if n, ok := m["number"].(int64); ok {
				port = int(n)
			}
		}
	}
	return labels.SelectorFromSet(ml), port, nil
}

func (r *Reconciler) writeStatus(ctx context.Context, cfg *v1alpha1.InferenceGatewayConfig, st v1alpha1.InferenceGatewayConfigStatus) error {
	if r.Leader != nil && !r.Leader() {
		return nil // another replica writes status; winning the Lease re-runs this
	}
	// Conditions that did not change keep their transition times, so that an
	// unchanged status compares equal and is not rewritten on every pod event.
	keepTimes(st.Conditions, cfg.Status.Conditions, cfg.Generation)
	for i := range st.Schedulers {
		var prev []metav1.Condition
		for _, old := range cfg.Status.Schedulers {
			if old.Name == st.Schedulers[i].Name {
				prev = old.Conditions
			}
		}
		keepTimes(st.Schedulers[i].Conditions, prev, cfg.Generation)
	}
	if equality.Semantic.DeepEqual(cfg.Status, st) {
		return nil
	}
	cfg.Status = st
	if err := r.Client.Status().Update(ctx, cfg); err != nil {
		// A conflict too goes back to the queue: status-only changes trigger no
		// event, so nothing else would write this status again.
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// keepTimes stamps conditions with the generation, and with the transition time
// of the same condition in prev when its status did not change (else now).
func keepTimes(conds, prev []metav1.Condition, generation int64) {
	for i := range conds {
		c := &conds[i]
		c.ObservedGeneration = generation
		if old := meta.FindStatusCondition(prev, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = metav1.Now()
		}
	}
}

func schedulerCondition(sts []v1alpha1.SchedulerStatus, name string) string {
	for _, s := range sts {
		if s.Name == name && len(s.Conditions) > 0 {
			return s.Conditions[0].Message
		}
	}
	return "no endpoints"
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hostPort(ip string, port int) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(port)
	}
	return ip + ":" + strconv.Itoa(port)
}

// trim keeps condition messages within the API's 32 KiB limit.
func trim(s string) string {
	if len(s) > 4096 {
		return s[:4093] + "..."
	}
	return s
}
