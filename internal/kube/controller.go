// Package kube runs kvgate inside Kubernetes: it watches one
// InferenceGatewayConfig and the Pods (or InferencePools) its schedulers select,
// turns ready pods into endpoints, applies the result to the gateway, and reports
// status. Every replica reconciles and serves on its own; only the elected leader
// writes status.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	poolv1 "github.com/kvgate/kvgate/api/inferencepool/v1"
	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/route"
)

// InferencePoolGVK is the upstream pool resource kvgate accepts as a pool source.
var InferencePoolGVK = poolv1.GroupVersion.WithKind("InferencePool")

// Applier is what the controller drives: the gateway.
type Applier interface {
	Apply(cfg *v1alpha1.InferenceGatewayConfig) error
	RecordRejected(err error)
}

// GVK of the resource kvgate serves. It is read as an unstructured object so
// that one the typed decoder would refuse (a duration no kvgate can parse,
// stored before the schema checked it) is a rejected configuration, not a
// watch that never syncs.
var configGVK = v1alpha1.GroupVersion.WithKind(v1alpha1.Kind)

// Reconciler keeps the gateway serving what the cluster says. Accepting a new
// configuration and following the pods are separate: the served configuration
// (the last accepted generation) always has its endpoints resolved against the
// pods of now, whether the newest edit was rejected or the resource deleted.
type Reconciler struct {
	Client  client.Client
	Target  types.NamespacedName // the InferenceGatewayConfig this gateway serves
	Gateway Applier
	Log     *slog.Logger
	// Leader says whether this replica may write status and Events (leader
	// election); nil writes always.
	Leader func() bool
	// Events records Kubernetes Events on the resource; nil records none.
	Events events.EventRecorder
	// Pools says whether the API server serves the InferencePool resource now;
	// nil means it does not.
	Pools func() bool
	// StatusWriteFailures counts the status writes the API server refused, by
	// its reason; nil counts none.
	StatusWriteFailures *prometheus.CounterVec
	// kick, when set, re-runs the reconcile on demand (on winning the Lease, on
	// the InferencePool resource appearing).
	kick <-chan event.GenericEvent
	// secrets follows the Secret spec.tls names, when the gateway serves
	// spec.tls (Certificates).
	secrets *secretWatch

	mu       sync.Mutex
	serving  *v1alpha1.InferenceGatewayConfig // the accepted spec, endpoints unresolved; nil before the first
	applied  *v1alpha1.InferenceGatewayConfig // what the gateway runs: serving, resolved
	recorded bool                             // a rejection was recorded in the gateway since the last apply
	logged   string                           // the last rejection logged, so that pod events do not repeat it
	gone     bool                             // the resource's deletion was logged
	refused  string                           // the last refusal of a status write reported, so that retries do not repeat it
}

// Scraping is a gateway that scrapes its endpoints' metrics (kvgate's Host):
// status then counts an endpoint as answering only while its scrapes succeed.
type Scraping interface {
	Router() *route.Router
}

// healthResync is how often the status Lease holder looks at the endpoints'
// scrape health again: scrapes change nothing the watches see.
const healthResync = 2 * time.Second

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
	if err := poolv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// configObject is an empty unstructured InferenceGatewayConfig.
func configObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(configGVK)
	return u
}

// SetupWithManager registers the reconciler: the config itself, and any Pod or
// InferencePool in its namespace, trigger a reconcile of the one config. It
// returns the controller, to which watchPools adds the InferencePool watch
// when the resource appears later.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) (controller.Controller, error) {
	// Status writes bump the resource version but not the generation: only spec
	// changes (and pods) need a reconcile.
	b := ctrl.NewControllerManagedBy(mgr).
		Named("kvgate").
		For(configObject(), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Pod{}, r.toTarget()).
		// Every replica reconciles: serving must not wait for an election.
		WithOptions(controller.Options{NeedLeaderElection: ptr(false)})
	if r.Pools != nil && r.Pools() {
		b = b.Watches(&poolv1.InferencePool{}, r.toTarget())
	}
	if r.kick != nil {
		b = b.WatchesRawSource(source.Channel(r.kick, r.toTarget()))
	}
	return b.Build(r)
}

// toTarget maps any object of the target's namespace (or a kick) to the target.
func (r *Reconciler) toTarget() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if ns := o.GetNamespace(); ns != "" && ns != r.Target.Namespace {
			return nil
		}
		return []reconcile.Request{{NamespacedName: r.Target}}
	})
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.NamespacedName != r.Target {
		return reconcile.Result{}, nil
	}
	res, err := r.reconcile(ctx)
	if err != nil {
		// Retried with backoff; controller-runtime logs it too.
		r.Log.Warn("reconcile failed; retrying", "config", r.Target, "err", err)
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	obj := configObject()
	found := true
	if err := r.Client.Get(ctx, r.Target, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		found = false
	}
	var latest *v1alpha1.InferenceGatewayConfig
	var problems []string
	if found {
		latest, problems = decode(obj)
	}
	r.Log.Debug("reconcile", "config", r.Target, "found", found, "generation", obj.GetGeneration(), "problems", problems)
	if r.secrets != nil {
		// The Secret of what the gateway runs, however this reconcile ends.
		defer func() { r.secrets.follow(tlsSecret(r.applied)) }()
	}
	// Once r.applied is settled below, the Secret watch follows it before
	// status is computed: spec.tls removed clears TLSReady in this very
	// write (stopping the watch triggers no reconcile of its own).
	// The newest generation is served when it is valid and the gateway takes
	// it; else the one served before goes on, following the pods of now.
	var statuses []v1alpha1.SchedulerStatus
	appliedNow := false
	for _, cand := range []*v1alpha1.InferenceGatewayConfig{latest, r.serving} {
		if cand == nil || (cand == latest && len(problems) > 0) {
			continue
		}
		resolved, sts, err := r.resolve(ctx, cand)
		var spec specError
		if err != nil && !errors.As(err, &spec) {
			return reconcile.Result{}, err // the API server's trouble: retried with backoff
		}
		applied := false
		if err == nil {
			// The newest generation accepted after a rejection is applied even
			// if it equals what runs, so that the gateway forgets the rejection.
			applied, err = r.apply(resolved, cand == latest && r.recorded)
		}
		appliedNow = appliedNow || applied
		if err != nil {
			if cand == latest {
				problems = append(problems, err.Error())
				continue
			}
			return reconcile.Result{}, err
		}
		if cand == latest && (r.serving == nil || r.serving.UID != latest.UID || r.serving.Generation != latest.Generation) {
			r.Log.Info("configuration accepted", "config", r.Target, "generation", latest.Generation, "schedulers", len(latest.Spec.Schedulers))
		}
		r.serving, statuses = cand, sts
		break
	}
	if len(problems) > 0 {
		err := fmt.Errorf("generation %d rejected: %s", obj.GetGeneration(), strings.Join(problems, "; "))
		// Recorded once, and again after an apply (pods came or went) cleared it.
		if key := err.Error(); key != r.logged || appliedNow || !r.recorded {
			r.Gateway.RecordRejected(err)
			r.recorded = true
		}
		if key := err.Error(); key != r.logged {
			r.logged = key
			if r.serving != nil {
				r.Log.Error("configuration rejected; the last accepted one keeps serving", "config", r.Target, "generation", obj.GetGeneration(),
					"serving", r.serving.Generation, "problems", problems)
			} else {
				r.Log.Error("configuration rejected and none was accepted before: nothing is served until it is fixed", "config", r.Target,
					"generation", obj.GetGeneration(), "problems", problems)
			}
		}
	} else {
		r.logged = ""
	}
	if !found {
		if r.serving != nil && !r.gone {
			r.gone = true
			r.Log.Warn("InferenceGatewayConfig deleted; its last configuration keeps serving its pods until kvgate is stopped or it is created again", "config", r.Target)
		}
		return reconcile.Result{}, nil
	}
	r.gone = false
	if r.secrets != nil {
		r.secrets.follow(tlsSecret(r.applied))
	}
	health := r.scrapeHealth(statuses)
	res, err := r.writeStatus(ctx, obj, r.status(latest, obj, problems, statuses))
	if err == nil && res.RequeueAfter == 0 && health && (r.Leader == nil || r.Leader()) {
		res.RequeueAfter = healthResync
	}
	return res, err
}

// scrapeHealth turns the Ready condition of each scheduler whose every
// endpoint fails its metrics scrape false: pods ready but a model server that
// does not answer (a wrong targetPort, a hung process) serve nothing. It says
// whether some endpoint's health is worth looking at again later.
func (r *Reconciler) scrapeHealth(sts []v1alpha1.SchedulerStatus) bool {
	sg, ok := r.Gateway.(Scraping)
	if !ok || r.applied == nil {
		return false
	}
	failAfter := r.applied.Spec.Gateway.UnhealthyAfter()
	views := map[string]route.SchedulerView{}
	for _, v := range sg.Router().FleetView() {
		views[v.Scheduler] = v
	}
	watch := false
	for i := range sts {
		st := &sts[i]
		v, ok := views[st.Name]
		if !ok || st.Endpoints == 0 || len(v.Endpoints) == 0 || len(st.Conditions) == 0 || st.Conditions[0].Status != metav1.ConditionTrue {
			continue
		}
		watch = true
		failing, lastErr := 0, ""
		for _, e := range v.Endpoints {
			// Unhealthy once its failures reach unhealthyAfter; one never
			// scraped yet is not judged before as many tries.
			if !e.Healthy && (e.Scraped || e.ScrapeErrors >= uint64(failAfter)) {
				failing++
				if lastErr == "" {
					lastErr = e.LastError
				}
			}
		}
		if failing < len(v.Endpoints) {
			continue
		}
		st.RolloutState = "Degraded"
		st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "EndpointsNotAnswering",
			Message: fmt.Sprintf("%s, but none of its %d endpoints answers its metrics scrape (%d failures in a row or more; last: %s): requests are refused with 503",
				st.Conditions[0].Message, len(v.Endpoints), failAfter, lastErr)}}
	}
	return watch
}

// apply hands a resolved configuration to the gateway unless it is what runs:
// an event that changes nothing served (another pod in the namespace, a status
// write) must not rebuild pools and transports;
// force applies it all the same. It says whether it applied.
func (r *Reconciler) apply(resolved *v1alpha1.InferenceGatewayConfig, force bool) (bool, error) {
	if r.applied != nil && !force && equality.Semantic.DeepEqual(r.applied.Spec, resolved.Spec) {
		return false, nil
	}
	if err := r.Gateway.Apply(resolved); err != nil {
		return false, err
	}
	r.applied, r.recorded = resolved, false
	return true, nil
}

// decode reads the resource's spec as kvgate's file loader does: every field
// that does not decode, and every check that fails, is one problem naming its
// field.
func decode(obj *unstructured.Unstructured) (*v1alpha1.InferenceGatewayConfig, []string) {
	doc := obj.DeepCopy().Object
	// Status is kvgate's own output (possibly written by a newer replica);
	// metadata beyond the name is the API server's.
	delete(doc, "status")
	doc["metadata"] = map[string]any{"name": obj.GetName(), "namespace": obj.GetNamespace()}
	// A field that does not decode hides the checks of the rest: it is
	// dropped and the rest read again, so that status lists every problem.
	var problems []string
	seen := map[string]bool{}
	for range 10 {
		raw, err := json.Marshal(doc)
		if err != nil {
			return nil, append(problems, err.Error())
		}
		cfg, err := config.Parse(obj.GetNamespace()+"/"+obj.GetName(), raw)
		if err == nil {
			if len(problems) > 0 {
				return nil, problems
			}
			cfg.ObjectMeta = metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: obj.GetName(), Generation: obj.GetGeneration(), UID: obj.GetUID()}
			return cfg, nil
		}
		var ce *config.Error
		if !errors.As(err, &ce) {
			return nil, append(problems, err.Error())
		}
		dropped := false
		for i, msg := range ce.Messages() {
			if !seen[msg] {
				seen[msg] = true
				problems = append(problems, msg)
			}
			if p := ce.Problems[i].Path; p != "" && dropPath(doc, p) {
				dropped = true
			}
		}
		if !dropped {
			break
		}
	}
	return nil, problems
}

// dropPath deletes the field at a path like spec.schedulers[0].routeTimeout
// from a JSON document, saying whether it was there.
func dropPath(doc map[string]any, path string) bool {
	var cur any = doc
	parts := strings.Split(path, ".")
	for i, part := range parts {
		name, idx, _ := strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		last := i == len(parts)-1
		if idx == "" {
			if last {
				_, there := m[name]
				delete(m, name)
				return there
			}
			cur = m[name]
			continue
		}
		list, ok := m[name].([]any)
		n, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
		if !ok || err != nil || n < 0 || n >= len(list) {
			return false
		}
		if last {
			return false // list items are not dropped: the indexes of later problems would move
		}
		cur = list[n]
	}
	return false
}

// status describes what is served now and what became of the newest edit.
func (r *Reconciler) status(latest *v1alpha1.InferenceGatewayConfig, obj *unstructured.Unstructured, problems []string, sts []v1alpha1.SchedulerStatus) v1alpha1.InferenceGatewayConfigStatus {
	generation := obj.GetGeneration()
	accepted := metav1.Condition{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: generation,
		Message: fmt.Sprintf("generation %d is valid and serving", generation)}
	if len(problems) > 0 {
		msg := problems[0]
		if len(problems) > 1 {
			msg = fmt.Sprintf("%d problems: %s", len(problems), strings.Join(problems, "; "))
		}
		accepted = metav1.Condition{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Invalid", ObservedGeneration: generation, Message: trim(msg)}
	}
	st := v1alpha1.InferenceGatewayConfigStatus{Conditions: []metav1.Condition{accepted}}
	if r.serving == nil {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NothingServing", ObservedGeneration: generation,
			Message: "no generation of this resource has been accepted: nothing is served until it is fixed"})
		return st
	}
	// What is served may come from an object deleted since, whose generations
	// mean nothing for this one: then no generation of this object is served.
	sameObject := r.serving.UID == obj.GetUID()
	if sameObject {
		st.ObservedGeneration = r.serving.Generation
	}
	servedGen := st.ObservedGeneration
	for i := range sts {
		for j := range sts[i].Conditions {
			c := &sts[i].Conditions[j]
			c.ObservedGeneration, c.Message = servedGen, trim(c.Message)
		}
	}
	st.Schedulers = sts
	st.ServedSchedulers = int32(len(sts))
	var empty []string
	for _, s := range sts {
		st.ReadyEndpoints += s.Endpoints
		if s.Endpoints == 0 || (len(s.Conditions) > 0 && s.Conditions[0].Status != metav1.ConditionTrue) {
			empty = append(empty, s.Name+": "+schedulerCondition(sts, s.Name))
		}
	}
	served := ""
	switch {
	case !sameObject:
		served = fmt.Sprintf(" (serving the last accepted configuration of a deleted InferenceGatewayConfig of this name: generation %d of this one was rejected)", generation)
	case latest == nil || r.serving.Generation != latest.Generation:
		served = fmt.Sprintf(" (serving generation %d: generation %d was rejected)", r.serving.Generation, generation)
	}
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "EndpointsReady", ObservedGeneration: servedGen,
		Message: "every scheduler has ready endpoints" + served}
	if len(empty) > 0 {
		ready = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoReadyEndpoints", ObservedGeneration: servedGen,
			Message: trim(strings.Join(empty, "; ") + served)}
	}
	return r.withTLS(st, ready)
}

// resolve fills each scheduler's endpoints from the ready pods it selects and
// reports per-scheduler status. A pool whose InferencePool is missing (or
// whose resource is not installed) has no endpoints, like a pod set gone to
// zero; only a selector kvgate cannot use is a spec error.
func (r *Reconciler) resolve(ctx context.Context, cfg *v1alpha1.InferenceGatewayConfig) (*v1alpha1.InferenceGatewayConfig, []v1alpha1.SchedulerStatus, error) {
	out := cfg.DeepCopy()
	var statuses []v1alpha1.SchedulerStatus
	for i := range out.Spec.Schedulers {
		sc := &out.Spec.Schedulers[i]
		if sc.ModelSelector == nil && sc.PoolRef == "" {
			statuses = append(statuses, v1alpha1.SchedulerStatus{Name: sc.Name, Endpoints: int32(len(sc.Endpoints)), RolloutState: "Available",
				Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "StaticEndpoints", Message: fmt.Sprintf("%d static endpoints", len(sc.Endpoints))}}})
			continue
		}
		src, err := r.sourceOf(ctx, cfg.Namespace, sc)
		if err != nil {
			var spec specError
			if errors.As(err, &spec) {
				return nil, nil, specError{fmt.Errorf("spec.schedulers[%d] (%s): %w", i, sc.Name, err)}
			}
			return nil, nil, err
		}
		// The pool's endpoints come from the cluster only.
		sc.Endpoints = []string{}
		if src.missing != nil {
			statuses = append(statuses, v1alpha1.SchedulerStatus{Name: sc.Name, RolloutState: "Pending", Conditions: []metav1.Condition{*src.missing}})
			continue
		}
		if src.appProtocol != "" {
			sc.AppProtocol = src.appProtocol
		}
		var pods corev1.PodList
		if err := r.Client.List(ctx, &pods, client.InNamespace(cfg.Namespace), client.MatchingLabelsSelector{Selector: src.selector}); err != nil {
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
				for _, port := range src.ports {
					ready = append(ready, hostPort(p.Status.PodIP, port))
				}
			}
		}
		sort.Strings(ready)
		sc.Endpoints = slices.Compact(ready)
		st := v1alpha1.SchedulerStatus{Name: sc.Name, Endpoints: int32(len(sc.Endpoints))}
		readyPods := len(sc.Endpoints) / max(len(src.ports), 1)
		ports := ""
		if len(src.ports) > 1 {
			ports = fmt.Sprintf(", %d target ports each", len(src.ports))
		}
		switch {
		case total == 0:
			st.RolloutState = "Pending"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoMatchingPods",
				Message: fmt.Sprintf("no pod in namespace %s matches selector %q%s", cfg.Namespace, src.selector.String(), src.from)}}
		case readyPods == 0:
			st.RolloutState = "Degraded"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoReadyPods",
				Message: fmt.Sprintf("%d pods match selector %q%s, none is ready with an IP", total, src.selector.String(), src.from)}}
		case readyPods < total:
			st.RolloutState = "Progressing"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "SomePodsReady",
				Message: fmt.Sprintf("%d of %d matching pods ready%s", readyPods, total, ports)}}
		default:
			st.RolloutState = "Available"
			st.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "PodsReady",
				Message: fmt.Sprintf("%d matching pods ready%s", total, ports)}}
		}
		statuses = append(statuses, st)
	}
	return out, statuses, nil
}

// podSource is where a scheduler's pods come from.
type podSource struct {
	selector    labels.Selector
	ports       []int
	appProtocol string            // from the InferencePool; "" keeps the scheduler's
	from        string            // " (InferencePool x)" for messages
	missing     *metav1.Condition // set when the pool cannot be read: no endpoints
}

// sourceOf returns a scheduler's pod selector and target ports, from its own
// fields or from the InferencePool it names.
func (r *Reconciler) sourceOf(ctx context.Context, ns string, sc *v1alpha1.SchedulerSpec) (podSource, error) {
	if sc.PoolRef == "" {
		sel, err := metav1.LabelSelectorAsSelector(sc.ModelSelector)
		if err != nil {
			return podSource{}, specError{fmt.Errorf("modelSelector: %w", err)}
		}
		if sel.Empty() {
			return podSource{}, specError{errors.New("modelSelector selects every pod; give it labels")}
		}
		return podSource{selector: sel, ports: []int{sc.Port()}}, nil
	}
	pending := func(reason, format string, args ...any) (podSource, error) {
		return podSource{missing: &metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: reason, Message: fmt.Sprintf(format, args...)}}, nil
	}
	if r.Pools == nil || !r.Pools() {
		return pending("InferencePoolNotInstalled", "poolRef %q: the API server does not serve InferencePools (inference.networking.k8s.io/v1); kvgate starts watching them as soon as their CRD is installed", sc.PoolRef)
	}
	var pool poolv1.InferencePool
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: sc.PoolRef}, &pool); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return pending("InferencePoolNotFound", "poolRef %q: no InferencePool of that name in namespace %s", sc.PoolRef, ns)
		}
		return podSource{}, fmt.Errorf("poolRef %q: %w", sc.PoolRef, err)
	}
	if len(pool.Spec.Selector.MatchLabels) == 0 {
		return pending("InvalidInferencePool", "InferencePool %q has no spec.selector.matchLabels", sc.PoolRef)
	}
	src := podSource{selector: labels.SelectorFromSet(pool.Spec.Selector.MatchLabels), from: fmt.Sprintf(" (InferencePool %s)", sc.PoolRef)}
	for _, n := range pool.Spec.Ports() {
		if n > 0 && n < 65536 {
			src.ports = append(src.ports, int(n))
		}
	}
	if len(src.ports) == 0 {
		return pending("InvalidInferencePool", "InferencePool %q has no spec.targetPorts", sc.PoolRef)
	}
	slices.Sort(src.ports)
	src.ports = slices.Compact(src.ports)
	switch proto := string(pool.Spec.AppProtocol); {
	case sc.HTTPS() && (proto == "" || proto == v1alpha1.AppProtocolHTTP):
		// An InferencePool cannot say https (its API has http, its default, and
		// h2c); TLS under its HTTP is the scheduler's to say, as a
		// BackendTLSPolicy is for other gateways.
	case sc.HTTPS() && proto == v1alpha1.AppProtocolH2C:
		return pending("InvalidInferencePool", "InferencePool %q: appProtocol %s is HTTP/2 without TLS, but the scheduler's appProtocol is https", sc.PoolRef, proto)
	case proto == "" || proto == v1alpha1.AppProtocolHTTP || proto == v1alpha1.AppProtocolH2C:
		src.appProtocol = proto
	default:
		return pending("InvalidInferencePool", "InferencePool %q: appProtocol %q is not %s or %s", sc.PoolRef, proto, v1alpha1.AppProtocolHTTP, v1alpha1.AppProtocolH2C)
	}
	return src, nil
}

// writeStatus writes st (and the Events its changes call for) when this
// replica holds the status Lease and st differs from what the resource says.
func (r *Reconciler) writeStatus(ctx context.Context, obj *unstructured.Unstructured, st v1alpha1.InferenceGatewayConfigStatus) (reconcile.Result, error) {
	if r.Leader != nil && !r.Leader() {
		return reconcile.Result{}, nil // another replica writes status; winning the Lease re-runs this
	}
	var prev v1alpha1.InferenceGatewayConfigStatus
	if raw, ok := obj.Object["status"].(map[string]any); ok {
		// A status this replica cannot read (a newer kvgate's) is rewritten.
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &prev)
	}
	// Conditions that did not change keep their transition times, so that an
	// unchanged status compares equal and is not rewritten on every pod event.
	keepTimes(st.Conditions, prev.Conditions)
	for i := range st.Schedulers {
		var old []metav1.Condition
		for _, o := range prev.Schedulers {
			if o.Name == st.Schedulers[i].Name {
				old = o.Conditions
			}
		}
		keepTimes(st.Schedulers[i].Conditions, old)
	}
	if equality.Semantic.DeepEqual(prev, st) {
		return reconcile.Result{}, nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return reconcile.Result{}, err
	}
	u := obj.DeepCopy()
	u.Object["status"] = raw
	if err := r.Client.Status().Update(ctx, u); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// Someone wrote the resource in between (an edit: its own event
			// follows) or deleted it. Routine: read it again.
			r.Log.Debug("status update raced another write; retrying", "config", r.Target, "err", err)
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		if ctx.Err() != nil {
			return reconcile.Result{}, nil //nolint:nilerr // stopping: nothing was refused, and an error would log as one
		}
		return r.statusRefused(obj, err)
	}
	r.refused = ""
	r.events(ref(u), prev, st)
	return reconcile.Result{}, nil
}

// statusRetry is how long a refused status write waits before it is tried
// again (a pod or spec change tries sooner).
const statusRetry = 30 * time.Second

// statusRefused reports a status write the API server refused: counted every
// time, and once per distinct refusal in the log and in a Warning Event (an
// Event is an object of its own, so it is written even when the resource
// cannot be). The write is tried again later: status-only changes trigger no
// event, so nothing else would.
func (r *Reconciler) statusRefused(obj *unstructured.Unstructured, err error) (reconcile.Result, error) {
	reason := string(apierrors.ReasonForError(err))
	if reason == "" {
		reason = "Unknown"
	}
	if r.StatusWriteFailures != nil {
		r.StatusWriteFailures.WithLabelValues(reason).Inc()
	}
	if msg := err.Error(); msg != r.refused {
		r.refused = msg
		r.Log.Error("the API server refused the status write; status is stale until it is accepted", "config", r.Target, "reason", reason, "err", err)
		if r.Events != nil {
			r.Events.Eventf(ref(obj), nil, corev1.EventTypeWarning, "StatusWriteFailed", "WriteStatus", "%s",
				trimEvent(fmt.Sprintf("the API server refused kvgate's status write (%s), so status is stale: %s", reason, msg)))
		}
	}
	return reconcile.Result{RequeueAfter: statusRetry}, nil
}

// ref is the object an Event is about, without its resource version: the
// Event recorder aggregates the repeats of one reason on one object into a
// series, which it can only do when their references compare equal (status
// writes change the resource version every time).
func ref(obj client.Object) *corev1.ObjectReference {
	gvk := obj.GetObjectKind().GroupVersionKind()
	return &corev1.ObjectReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID()}
}

// events records what changed between two statuses: a generation accepted or
// rejected, the served configuration degraded or recovered.
func (r *Reconciler) events(obj runtime.Object, prev, st v1alpha1.InferenceGatewayConfigStatus) {
	if r.Events == nil {
		return
	}
	emit := func(typ, reason, note string) {
		r.Events.Eventf(obj, nil, typ, reason, reason, "%s", trimEvent(note))
	}
	was, now := meta.FindStatusCondition(prev.Conditions, "Accepted"), meta.FindStatusCondition(st.Conditions, "Accepted")
	if now != nil && (was == nil || was.Status != now.Status || was.ObservedGeneration != now.ObservedGeneration || was.Message != now.Message) {
		if now.Status == metav1.ConditionTrue {
			emit(corev1.EventTypeNormal, "Accepted", now.Message)
		} else {
			emit(corev1.EventTypeWarning, "Rejected", fmt.Sprintf("generation %d: %s", now.ObservedGeneration, now.Message))
		}
	}
	was, now = meta.FindStatusCondition(prev.Conditions, "Ready"), meta.FindStatusCondition(st.Conditions, "Ready")
	switch {
	case now == nil:
	case now.Status != metav1.ConditionTrue && (was == nil || was.Status == metav1.ConditionTrue):
		emit(corev1.EventTypeWarning, "Degraded", now.Message)
	case now.Status == metav1.ConditionTrue && was != nil && was.Status != metav1.ConditionTrue:
		emit(corev1.EventTypeNormal, "Recovered", now.Message)
	}
}

// keepTimes gives each condition the transition time of the same condition in
// prev when its status did not change (else now).
func keepTimes(conds, prev []metav1.Condition) {
	for i := range conds {
		c := &conds[i]
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

// trimEvent keeps an Event's note within the API's 1 KiB limit.
func trimEvent(s string) string { return trimTo(s, 1024) }

// trim keeps condition messages within the API's 32 KiB limit, with room for
// many schedulers.
func trim(s string) string { return trimTo(s, 4096) }

// trimTo cuts s to at most n bytes at a rune boundary: a cut rune would be
// stored replaced, and the status would never compare equal again.
func trimTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
