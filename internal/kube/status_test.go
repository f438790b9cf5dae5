package kube

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

const configCRD = "inferencegatewayconfigs.gateway.kvgate.io"

// installShippedCRD applies the InferenceGatewayConfig CRD kvgate ships over
// whatever is installed, and waits until the API server checks with it.
func (k *cluster) installShippedCRD(t *testing.T, ns string) {
	t.Helper()
	if _, err := envtest.InstallCRDs(k.cfg, envtest.CRDInstallOptions{Paths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("installing the shipped CRD: %v", err)
	}
	probe := configObjectNamed(ns, "schema-probe")
	probe.Object["spec"] = map[string]any{"bbr": map[string]any{"enabled": true}, "schedulers": []any{map[string]any{
		"name": "p", "modelName": "p", "endpoints": []any{"127.0.0.1:1"}, "routeTimeout": "abc"}}}
	waittest.Until(t, 10*time.Second, "the API server to check with the shipped CRD", func() bool {
		err := k.c.Create(context.Background(), probe.DeepCopy())
		if err == nil {
			_ = k.c.Delete(context.Background(), probe.DeepCopy())
		}
		return apierrors.IsInvalid(err)
	})
}

// unratchetCRD rewrites the installed CRD's duration rules as kvgate wrote
// them before they passed unchanged values: duration() on a stored string it
// cannot parse then raises an error, which the API server does not ratchet.
func (k *cluster) unratchetCRD(t *testing.T) {
	t.Helper()
	const guard = "(oldSelf.hasValue() && oldSelf.value() == self) || ("
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := k.c.Get(context.Background(), types.NamespacedName{Name: configCRD}, crd); err != nil {
			return err
		}
		n := 0
		var walk func(any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				if rules, ok := v["x-kubernetes-validations"].([]any); ok {
					for _, r := range rules {
						rule := r.(map[string]any)
						if s, _ := rule["rule"].(string); strings.HasPrefix(s, guard) {
							rule["rule"] = strings.TrimSuffix(strings.TrimPrefix(s, guard), ")")
							delete(rule, "optionalOldSelf")
							n++
						}
					}
				}
				for _, c := range v {
					walk(c)
				}
			case []any:
				for _, c := range v {
					walk(c)
				}
			}
		}
		walk(crd.Object["spec"])
		if n == 0 {
			t.Fatal("the shipped CRD has no guarded duration rule")
		}
		return k.c.Update(context.Background(), crd)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// llamas runs n simulated model servers as ready pods llama-0... labelled
// app=llama in ns.
func (k *cluster) llamas(t *testing.T, ns string, n int) (ips []string, port int, lbls map[string]string) {
	t.Helper()
	ips, port = servers(t, n)
	lbls = map[string]string{"app": "llama"}
	for i, ip := range ips {
		k.pod(t, ns, fmt.Sprintf("llama-%d", i), ip, true, lbls)
	}
	return ips, port, lbls
}

// TestStoredBadDuration: a duration stored under a CRD that did not check it
// (an older release's) leaves the object updatable once the shipped CRD is
// installed: status keeps following the pods and names the bad field, and
// labels can be set. Under rules that do refuse such an object, kvgate says
// so in an Event and a metric, once per refusal, instead of only logging.
func TestStoredBadDuration(t *testing.T) {
	k := startCluster(t)
	const ns = "stored"
	k.namespace(t, ns)
	k.loosenCRD(t)
	ips, port, _ := k.llamas(t, ns, 2)
	scheduler := map[string]any{"name": "llama", "modelName": model, "targetPort": int64(port),
		"modelSelector": map[string]any{"matchLabels": map[string]any{"app": "llama"}}}
	spec := map[string]any{"bbr": map[string]any{"enabled": true}, "schedulers": []any{scheduler}}
	a := startReplica(t, k, types.NamespacedName{Namespace: ns, Name: "gw"}, Options{})
	k.raw(t, ns, "gw", spec)
	waittest.Until(t, 15*time.Second, "status: 2 ready endpoints", func() bool {
		st := k.rawStatus(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && st.ReadyEndpoints == 2
	})
	scheduler["routeTimeout"] = "abc"
	k.raw(t, ns, "gw", spec)
	waittest.Until(t, 15*time.Second, "status: the stored routeTimeout rejected", func() bool {
		acc := condition(k.rawStatus(t, ns, "gw"), "Accepted")
		return acc.Status == metav1.ConditionFalse && acc.Reason == "Invalid" && strings.Contains(acc.Message, "spec.schedulers[0].routeTimeout")
	})
	k.installShippedCRD(t, ns)

	// kubectl label: an update that leaves the bad field as it is.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := configObject()
		if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "gw"}, u); err != nil {
			return err
		}
		u.SetLabels(map[string]string{"team": "inference"})
		return k.c.Update(context.Background(), u)
	})
	if err != nil {
		t.Fatalf("labelling the object stored with a bad duration: %v", err)
	}
	// A changed bad value is still refused.
	u := configObject()
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "gw"}, u); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object["spec"].(map[string]any)["schedulers"].([]any)[0].(map[string]any), "xyz", "routeTimeout")
	if err := k.c.Update(context.Background(), u); !apierrors.IsInvalid(err) {
		t.Errorf("changing routeTimeout to another bad value: %v, want refused", err)
	}

	// A pod change: status follows.
	k.setReady(t, ns, "llama-0", ips[0], false)
	waittest.Until(t, 10*time.Second, "status: 1 ready endpoint after a pod left", func() bool {
		st := k.rawStatus(t, ns, "gw")
		return st.ReadyEndpoints == 1 && condition(st, "Accepted").Status == metav1.ConditionFalse &&
			strings.Contains(condition(st, "Ready").Message, "serving generation 1")
	})
	reg := a.g.Metrics().Registry
	if n := promtest.Value(t, reg, StatusWriteFailuresMetric); n != 0 {
		t.Errorf("%v status writes refused under the shipped CRD", n)
	}

	// Rules that raise an error on the stored value: every status write is
	// refused; kvgate says why in an Event and counts it.
	k.unratchetCRD(t)
	waittest.Until(t, 10*time.Second, "the API server to refuse the labelled object's updates", func() bool {
		u := configObject()
		if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "gw"}, u); err != nil {
			return false
		}
		u.SetLabels(map[string]string{"team": "other"})
		return apierrors.IsInvalid(k.c.Update(context.Background(), u))
	})
	k.setReady(t, ns, "llama-0", ips[0], true)
	var note string
	waittest.Until(t, 15*time.Second, "a StatusWriteFailed Event", func() bool {
		note = eventNote(t, k, ns, "gw", "StatusWriteFailed")
		return note != ""
	})
	for _, want := range []string{"refused kvgate's status write (Invalid)", "spec.schedulers[0].routeTimeout", "evaluating rule"} {
		if !strings.Contains(note, want) {
			t.Errorf("StatusWriteFailed Event does not say %q: %s", want, note)
		}
	}
	if n := promtest.Value(t, reg, StatusWriteFailuresMetric, "reason", "Invalid"); n < 1 {
		t.Errorf("%s{reason=Invalid} = %v after a refused write", StatusWriteFailuresMetric, n)
	}
	if n := strings.Count(a.logs.String(), "refused the status write"); n != 1 {
		t.Errorf("the refusal logged %d times, want once", n)
	}
}

// eventNote is the note of the Event of that reason on a config ("" for none).
func eventNote(t *testing.T, k *cluster, ns, name, reason string) string {
	t.Helper()
	for _, e := range k.eventObjects(t, ns, name) {
		if r, _, _ := unstructured.NestedString(e.Object, "reason"); r == reason {
			n, _, _ := unstructured.NestedString(e.Object, "note")
			return n
		}
	}
	return ""
}

// eventObjects lists the Events recorded on a config.
func (k *cluster) eventObjects(t *testing.T, ns, name string) []unstructured.Unstructured {
	t.Helper()
	var list unstructured.UnstructuredList
	list.SetAPIVersion("events.k8s.io/v1")
	list.SetKind("EventList")
	if err := k.c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []unstructured.Unstructured
	for _, e := range list.Items {
		if n, _, _ := unstructured.NestedString(e.Object, "regarding", "name"); n == name {
			out = append(out, e)
		}
	}
	return out
}

// serveLlamas creates the config gw of one scheduler selecting lbls at port,
// and a replica serving it.
func (k *cluster) serveLlamas(t *testing.T, ns string, port int, lbls map[string]string) {
	t.Helper()
	cfg := igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "llama", ModelName: model, TargetPort: ptr(int32(port)),
		ModelSelector: &metav1.LabelSelector{MatchLabels: lbls}})
	if err := k.c.Create(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	gatewayUnderTest(t, k, types.NamespacedName{Namespace: ns, Name: "gw"})
}

// TestEndpointsNotAnswering: pods ready at a port where nothing answers (a
// wrong targetPort) make Ready false: status says what serving can do, not
// what the pods claim.
func TestEndpointsNotAnswering(t *testing.T) {
	k := startCluster(t)
	const ns = "silent"
	k.namespace(t, ns)
	ips, port, lbls := k.llamas(t, ns, 2)
	dead := freePorts(t, ips[0], 1)[0]
	k.serveLlamas(t, ns, dead, lbls)
	var st v1alpha1.InferenceGatewayConfigStatus
	waittest.Until(t, 15*time.Second, "Ready=False: no endpoint answers", func() bool {
		st = k.status(t, ns, "gw")
		return condition(st, "Ready").Status == metav1.ConditionFalse && len(st.Schedulers) == 1 &&
			st.Schedulers[0].Conditions[0].Reason == "EndpointsNotAnswering"
	})
	if s := st.Schedulers[0]; s.RolloutState != "Degraded" || !strings.Contains(s.Conditions[0].Message, "none of its 2 endpoints answers") {
		t.Errorf("scheduler status %+v", s)
	}

	// The right port: Ready again without any pod changing.
	k.edit(t, types.NamespacedName{Namespace: ns, Name: "gw"}, func(c *v1alpha1.InferenceGatewayConfig) {
		c.Spec.Schedulers[0].TargetPort = ptr(int32(port))
	})
	waittest.Until(t, 15*time.Second, "Ready=True at the right port", func() bool {
		st = k.status(t, ns, "gw")
		return condition(st, "Ready").Status == metav1.ConditionTrue && st.Schedulers[0].RolloutState == "Available"
	})
}

// TestEventsDamped: pods flapping make one Event object per reason, its
// series counting the repeats, not an Event per flap.
func TestEventsDamped(t *testing.T) {
	k := startCluster(t)
	const ns = "flaps"
	k.namespace(t, ns)
	ips, port, lbls := k.llamas(t, ns, 2)
	k.serveLlamas(t, ns, port, lbls)
	ready := func(want metav1.ConditionStatus) {
		waittest.Until(t, 10*time.Second, "Ready="+string(want), func() bool {
			return condition(k.status(t, ns, "gw"), "Ready").Status == want
		})
	}
	ready(metav1.ConditionTrue)
	const flaps = 5
	for range flaps {
		for i, ip := range ips {
			k.setReady(t, ns, fmt.Sprintf("llama-%d", i), ip, false)
		}
		ready(metav1.ConditionFalse)
		for i, ip := range ips {
			k.setReady(t, ns, fmt.Sprintf("llama-%d", i), ip, true)
		}
		ready(metav1.ConditionTrue)
	}
	count := func(reason string) (objects int, total int64) {
		for _, e := range k.eventObjects(t, ns, "gw") {
			if r, _, _ := unstructured.NestedString(e.Object, "reason"); r == reason {
				objects++
				n, found, _ := unstructured.NestedInt64(e.Object, "series", "count")
				if !found {
					n = 1
				}
				total += n
			}
		}
		return objects, total
	}
	// client-go's recorder writes a series' count when it starts (2) and
	// then on its 30-minute heartbeat: the count read here stays at 2.
	for _, reason := range []string{"Degraded", "Recovered"} {
		var objects int
		var total int64
		waittest.Until(t, 10*time.Second, reason+" Events as a series", func() bool {
			objects, total = count(reason)
			return total >= 2
		})
		time.Sleep(500 * time.Millisecond) // any Event still being written
		if objects, total = count(reason); objects != 1 {
			t.Errorf("%d flaps: %d %s Event objects (counting %d), want 1", flaps, objects, reason, total)
		}
	}
}

// TestProcessKilledLease: `kvgate serve --igwc` processes hold the status
// Lease under their --replica-name; one killed with SIGKILL (no release)
// hands status over once its --lease-duration has passed, plus a retry.
func TestProcessKilledLease(t *testing.T) {
	k := startCluster(t)
	const ns = "killed"
	k.namespace(t, ns)
	if err := k.c.Create(context.Background(), igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "s", ModelName: model, Endpoints: []string{"127.0.0.1:1"}})); err != nil {
		t.Fatal(err)
	}
	const lease = 4 * time.Second
	start := func(name string) (*exec.Cmd, *logtest.Buffer) {
		return k.serveProcess(t, ns+"/gw", "--lease-duration", lease.String(), "--replica-name", name)
	}
	a, _ := start("kvgate-a")
	waittest.Until(t, 30*time.Second, "kvgate-a to hold the Lease", func() bool { return k.leaseHolder(t, ns, "kvgate-status-gw") == "kvgate-a" })
	_, bout := start("kvgate-b")
	waittest.Until(t, 30*time.Second, "kvgate-b to watch the cluster", func() bool { return strings.Contains(bout.String(), "watching the cluster") })
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	killed := time.Now()
	waittest.Until(t, 3*lease, "kvgate-b to take the Lease", func() bool { return k.leaseHolder(t, ns, "kvgate-status-gw") == "kvgate-b" })
	took := time.Since(killed)
	t.Logf("SIGKILL → Lease kvgate-a → kvgate-b in %v (lease %v)", took, lease)
	// The Lease was renewed at most a retry period before the kill; taking it
	// needs it expired by the taker's clock and one more retry (jittered up to
	// 1.2 × 0.5 s).
	if took < lease-time.Second || took > lease+1500*time.Millisecond {
		t.Errorf("handover after SIGKILL took %v, want about the lease duration %v (within +1.5s)", took, lease)
	}
}
