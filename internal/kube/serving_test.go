package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/waittest"
)

// installPools installs kvgate's InferencePool CRD and waits until it is served.
func (k *cluster) installPools(t *testing.T) {
	t.Helper()
	if _, err := envtest.InstallCRDs(k.cfg, envtest.CRDInstallOptions{Paths: []string{poolCRD}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("installing the InferencePool CRD: %v", err)
	}
}

// loosenCRD replaces the InferenceGatewayConfig CRD's schema by one that
// accepts any spec, as a CRD from an older kvgate checked less: the API server
// then stores objects this kvgate must refuse without breaking.
func (k *cluster) loosenCRD(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	if err := k.c.Get(ctx, types.NamespacedName{Name: "inferencegatewayconfigs.gateway.kvgate.io"}, crd); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	open := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	v := versions[0].(map[string]any)
	v["schema"] = map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "properties": map[string]any{"spec": open, "status": open}}}
	_ = unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions")
	if err := k.c.Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
}

// raw creates or updates an InferenceGatewayConfig from a spec the typed API
// could not hold. A refusal (the loosened schema not applied yet, a conflict
// with a status write) is retried on a fresh read.
func (k *cluster) raw(t *testing.T, ns, name string, spec map[string]any) {
	t.Helper()
	ctx := context.Background()
	waittest.Until(t, 10*time.Second, "the API server to store "+name, func() bool {
		u := configObjectNamed(ns, name)
		err := k.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u)
		switch {
		case apierrors.IsNotFound(err):
			u = configObjectNamed(ns, name)
			u.Object["spec"] = spec
			err = k.c.Create(ctx, u)
		case err == nil:
			u.Object["spec"] = spec
			err = k.c.Update(ctx, u)
		}
		if err != nil {
			t.Logf("storing %s: %v", name, err)
		}
		return err == nil
	})
}

// rawStatus reads a config's status without decoding its spec.
func (k *cluster) rawStatus(t *testing.T, ns, name string) v1alpha1.InferenceGatewayConfigStatus {
	t.Helper()
	u := configObject()
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	var st v1alpha1.InferenceGatewayConfigStatus
	if raw, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// events lists the reasons of the Events recorded on a config, oldest first.
func (k *cluster) events(t *testing.T, ns, name string) []string {
	t.Helper()
	var out []string
	for _, e := range k.eventObjects(t, ns, name) {
		r, _, _ := unstructured.NestedString(e.Object, "reason")
		out = append(out, r)
	}
	return out
}

// spread sends n requests and counts them by the endpoint that served them
// ("" for failures, with their status).
func spread(t *testing.T, base string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for range n {
		code, ep := post(t, base)
		if code != http.StatusOK {
			ep = fmt.Sprintf("status %d", code)
		}
		out[ep]++
	}
	return out
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestRejectedEditFollowsPods: a generation kvgate refuses (stored under a
// CRD that checked less, as an older release's did) leaves the last accepted
// one serving, and that one keeps following the pods: NotReady and deleted
// pods leave, returning ones come back, also after the resource is deleted.
// Status says what is served and lists every problem; Events mark each step;
// a replica started on the invalid resource stays up and says why.
func TestRejectedEditFollowsPods(t *testing.T) {
	k := startCluster(t)
	const ns = "edits"
	k.namespace(t, ns)
	k.loosenCRD(t)
	ips, port := servers(t, 3)
	lbls := map[string]string{"app": "llama"}
	for i, ip := range ips {
		k.pod(t, ns, fmt.Sprintf("llama-%d", i), ip, true, lbls)
	}
	ep := func(i int) string { return fmt.Sprintf("%s:%d", ips[i], port) }
	good := map[string]any{"bbr": map[string]any{"enabled": true}, "schedulers": []any{map[string]any{
		"name": "llama", "modelName": model, "targetPort": int64(port), "modelSelector": map[string]any{"matchLabels": map[string]any{"app": "llama"}}}}}
	a := startReplica(t, k, types.NamespacedName{Namespace: ns, Name: "gw"}, Options{})
	k.raw(t, ns, "gw", good)
	waittest.Until(t, 10*time.Second, "all three pods served", func() bool {
		return len(spread(t, a.url, 30)) == 3
	})

	// Three problems in one edit: a duration no Go program parses, an
	// out-of-range count, a field that does nothing.
	bad := runtime.DeepCopyJSONValue(good).(map[string]any)
	bad["gateway"] = map[string]any{"maxAttempts": int64(50)}
	bad["bbr"].(map[string]any)["replicas"] = int64(2)
	bad["schedulers"].([]any)[0].(map[string]any)["routeTimeout"] = "abc"
	k.raw(t, ns, "gw", bad)
	var st v1alpha1.InferenceGatewayConfigStatus
	waittest.Until(t, 10*time.Second, "generation 2 rejected", func() bool {
		st = k.rawStatus(t, ns, "gw")
		acc := condition(st, "Accepted")
		return acc.Status == metav1.ConditionFalse && acc.ObservedGeneration == 2
	})
	acc, ready := condition(st, "Accepted"), condition(st, "Ready")
	for _, want := range []string{"3 problems", "spec.schedulers[0].routeTimeout", `"abc"`, "spec.gateway.maxAttempts", "spec.bbr.replicas"} {
		if !strings.Contains(acc.Message, want) {
			t.Errorf("Accepted message does not say %q: %s", want, acc.Message)
		}
	}
	if acc.Reason != "Invalid" || ready.Status != metav1.ConditionTrue || !strings.Contains(ready.Message, "serving generation 1") ||
		st.ObservedGeneration != 1 || len(st.Schedulers) != 1 || st.Schedulers[0].Endpoints != 3 || st.ReadyEndpoints != 3 || st.ServedSchedulers != 1 {
		t.Errorf("after a rejected edit the status must describe generation 1, served: %+v", st)
	}

	// An event that changes nothing served applies nothing, rejection or not.
	applies := a.g.applied.Load()
	k.pod(t, ns, "unrelated", "127.0.0.20", true, map[string]string{"app": "other"})
	time.Sleep(500 * time.Millisecond)
	if n := a.g.applied.Load() - applies; n != 0 {
		t.Errorf("an unrelated pod under a rejected edit caused %d applies", n)
	}

	// Pod churn under the rejected edit: fully effective.
	k.setReady(t, ns, "llama-0", ips[0], false)
	if err := k.c.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama-1"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "only llama-2 in the pool", func() bool { return endpointsOf(t, a.g.Host, "llama") == ep(2) })
	if got := spread(t, a.url, 20); got[ep(2)] != 20 {
		t.Errorf("NotReady and deleted pods still get traffic: %v", got)
	}
	waittest.Until(t, 10*time.Second, "status: 1 endpoint", func() bool {
		st = k.rawStatus(t, ns, "gw")
		return st.ReadyEndpoints == 1 && st.Schedulers[0].RolloutState == "Progressing"
	})

	// No ready pod: Ready=False although an older configuration serves.
	k.setReady(t, ns, "llama-2", ips[2], false)
	waittest.Until(t, 10*time.Second, "Ready=False with no ready pod", func() bool {
		st = k.rawStatus(t, ns, "gw")
		r := condition(st, "Ready")
		return r.Status == metav1.ConditionFalse && r.Reason == "NoReadyEndpoints" && strings.Contains(r.Message, "none is ready")
	})
	if got := spread(t, a.url, 5); got["status 503"] != 5 {
		t.Errorf("no ready pod: %v, want five 503s", got)
	}
	k.setReady(t, ns, "llama-0", ips[0], true)
	waittest.Until(t, 10*time.Second, "Ready=True again", func() bool {
		return condition(k.rawStatus(t, ns, "gw"), "Ready").Status == metav1.ConditionTrue
	})
	waittest.Until(t, 10*time.Second, "Events Accepted, Rejected, Degraded, Recovered", func() bool {
		return hasAll(k.events(t, ns, "gw"), "Accepted", "Rejected", "Degraded", "Recovered")
	})

	// A new replica on the invalid resource: never served, so nothing to
	// serve; it stays up, says why, and serves as soon as the spec is fixed.
	b := startReplica(t, k, types.NamespacedName{Namespace: ns, Name: "gw"}, Options{})
	waittest.Until(t, 10*time.Second, "the new replica logs the rejection", func() bool {
		return strings.Contains(b.logs.String(), "nothing is served until it is fixed") && strings.Contains(b.logs.String(), "routeTimeout")
	})
	rec := httptest.NewRecorder()
	b.g.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "routeTimeout") {
		t.Errorf("/readyz of the new replica: %d %q, want 503 naming the problem", rec.Code, rec.Body.String())
	}
	if code, _ := post(t, b.url); code != http.StatusServiceUnavailable {
		t.Errorf("new replica with nothing accepted: status %d, want 503", code)
	}
	select {
	case <-b.stopped:
		t.Fatalf("the new replica's controller exited: %v", b.err)
	case <-time.After(2 * time.Second):
	}
	k.raw(t, ns, "gw", good)
	waittest.Until(t, 10*time.Second, "the new replica serves the fixed spec", func() bool {
		code, e := post(t, b.url)
		return code == http.StatusOK && e == ep(0)
	})
	waittest.Until(t, 10*time.Second, "generation 3 accepted", func() bool {
		st = k.rawStatus(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && st.ObservedGeneration == 3
	})

	// The resource deleted: the last configuration serves its pods, still
	// following them.
	if err := k.c.Delete(context.Background(), configObjectNamed(ns, "gw")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	k.setReady(t, ns, "llama-2", ips[2], true)
	k.setReady(t, ns, "llama-0", ips[0], false)
	for _, r := range []*replica{a, b} {
		waittest.Until(t, 5*time.Second, "only llama-2 after deletion", func() bool { return endpointsOf(t, r.g.Host, "llama") == ep(2) })
		if got := spread(t, r.url, 10); got[ep(2)] != 10 {
			t.Errorf("after the resource was deleted: %v", got)
		}
	}

	// Created again, invalid: the deleted object's configuration serves, and
	// status names no generation of the new object as served.
	k.raw(t, ns, "gw", bad)
	waittest.Until(t, 10*time.Second, "the recreated object rejected", func() bool {
		st = k.rawStatus(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionFalse && condition(st, "Accepted").ObservedGeneration == 1
	})
	if r := condition(st, "Ready"); st.ObservedGeneration != 0 || !strings.Contains(r.Message, "deleted InferenceGatewayConfig") {
		t.Errorf("recreated and rejected: observedGeneration %d, Ready %q; want none served of this object, and why", st.ObservedGeneration, r.Message)
	}
	if got := spread(t, a.url, 5); got[ep(2)] != 5 {
		t.Errorf("after the rejected re-creation: %v", got)
	}
}

func configObjectNamed(ns, name string) *unstructured.Unstructured {
	u := configObject()
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// TestPoolLifecycle: the InferencePool CRD installed after kvgate started is
// watched without a restart; each target port of a pool is an endpoint of
// every ready pod; the pool's appProtocol applies; deleting the pool empties
// the scheduler like a pod set gone to zero (the configuration stays
// accepted), and recreating it fills it again.
func TestPoolLifecycle(t *testing.T) {
	k := startCluster(t)
	const ns = "lifecycle"
	k.namespace(t, ns)
	ports := freePorts(t, "127.0.0.2", 2)
	for _, p := range ports {
		simtest.StartAt(t, simserver.Options{Model: model}, fmt.Sprintf("127.0.0.2:%d", p))
	}
	k.pod(t, ns, "ranks", "127.0.0.2", true, map[string]string{"pool": "dp"})
	r := startReplica(t, k, types.NamespacedName{Namespace: ns, Name: "gw"}, Options{PoolPollInterval: 200 * time.Millisecond})
	if err := k.c.Create(context.Background(), igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "dp", ModelName: model, PoolRef: "dp"})); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "status: InferencePool resource not installed", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && len(st.Schedulers) == 1 && len(st.Schedulers[0].Conditions) == 1 &&
			st.Schedulers[0].Conditions[0].Reason == "InferencePoolNotInstalled" && condition(st, "Ready").Status == metav1.ConditionFalse
	})

	k.installPools(t)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "dp", "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"pool": "dp"}},
			"targetPorts": []any{map[string]any{"number": int64(ports[0])}, map[string]any{"number": int64(ports[1])}},
			"appProtocol": "kubernetes.io/h2c"},
	}}
	create := func() {
		p := pool.DeepCopy()
		if err := k.c.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	create()
	want := fmt.Sprintf("127.0.0.2:%d,127.0.0.2:%d", min(ports[0], ports[1]), max(ports[0], ports[1]))
	waittest.Until(t, 10*time.Second, "two endpoints for the pod's two ports", func() bool { return endpointsOf(t, r.g.Host, "dp") == want })
	if got := spread(t, r.url, 30); len(got) != 2 {
		t.Errorf("requests over the two ranks: %v", got)
	}
	active, _, _ := r.g.Router().ConfigStatus()
	if active == nil || !active.Spec.Schedulers[0].H2C() {
		t.Errorf("the pool's appProtocol kubernetes.io/h2c is not applied: %+v", active)
	}
	waittest.Until(t, 10*time.Second, "status Ready with 2 endpoints", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Ready").Status == metav1.ConditionTrue && st.ReadyEndpoints == 2 && strings.Contains(st.Schedulers[0].Conditions[0].Message, "2 target ports")
	})

	if err := k.c.Delete(context.Background(), pool.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "no endpoints once the pool is deleted", func() bool { return endpointsOf(t, r.g.Host, "dp") == "" })
	waittest.Until(t, 10*time.Second, "status: pool not found, still accepted", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && condition(st, "Ready").Status == metav1.ConditionFalse &&
			st.Schedulers[0].Conditions[0].Reason == "InferencePoolNotFound"
	})
	create()
	waittest.Until(t, 5*time.Second, "endpoints back with the pool", func() bool { return endpointsOf(t, r.g.Host, "dp") == want })
}

// freePorts finds n ports free on ip.
func freePorts(t *testing.T, ip string, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// TestLeaseHandover: a replica that stops releases the status Lease, and the
// other takes status over within 2 s.
func TestLeaseHandover(t *testing.T) {
	k := startCluster(t)
	const ns = "lease"
	k.namespace(t, ns)
	target := types.NamespacedName{Namespace: ns, Name: "gw"}
	a := startReplica(t, k, target, Options{})
	waitHolder := func(what string, ok func(string) bool) string {
		var holder string
		waittest.Until(t, 20*time.Second, what, func() bool {
			l := &unstructured.Unstructured{}
			l.SetAPIVersion("coordination.k8s.io/v1")
			l.SetKind("Lease")
			if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "kvgate-status-gw"}, l); err != nil {
				return false
			}
			holder, _, _ = unstructured.NestedString(l.Object, "spec", "holderIdentity")
			return ok(holder)
		})
		return holder
	}
	first := waitHolder("the first replica to hold the Lease", func(h string) bool { return h != "" })
	b := startReplica(t, k, target, Options{})
	_ = b
	time.Sleep(1500 * time.Millisecond) // b campaigns and waits
	a.stop()
	<-a.stopped
	stopped := time.Now()
	second := waitHolder("the other replica to take the Lease", func(h string) bool { return h != "" && h != first })
	took := time.Since(stopped)
	t.Logf("Lease %s → %s in %v", first, second, took)
	if took > 2*time.Second {
		t.Errorf("status handed over in %v, want < 2s", took)
	}
	// The new holder writes status: a new config gets one.
	if err := k.c.Create(context.Background(), igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "s", ModelName: model, Endpoints: []string{"127.0.0.1:1"}})); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "status from the new holder", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && st.ReadyEndpoints == 1
	})

	// What kubectl get igwc prints: the API server's table for the resource.
	rc, err := rest.HTTPClientFor(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, strings.TrimSuffix(k.cfg.Host, "/")+"/apis/gateway.kvgate.io/v1alpha1/namespaces/lease/inferencegatewayconfigs", nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := rc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("%v: %d %s", err, resp.StatusCode, body)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if got := strings.Join(cols, " "); got != "Name Accepted Ready Schedulers Endpoints Age" || len(table.Rows) != 1 {
		t.Fatalf("kubectl get columns %q, %d rows", got, len(table.Rows))
	}
	if got := fmt.Sprint(table.Rows[0].Cells[:5]); got != "[gw True True 1 1]" {
		t.Errorf("kubectl get row %s, want [gw True True 1 1]", got)
	}
}

// serveProcess starts `kvgate serve --igwc target` against the cluster as a
// process of its own, killed when the test ends.
func (k *cluster) serveProcess(t *testing.T, target string, args ...string) (*exec.Cmd, *logtest.Buffer) {
	t.Helper()
	var out logtest.Buffer
	cmd := exec.Command(testenv.Kvgate(t), append([]string{"serve", "--igwc", target, "--kubeconfig", k.kubeconfig(t),
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("kvgate %s log:\n%s", strings.Join(args, " "), out.String())
		}
	})
	return cmd, &out
}

// leaseHolder reads the status Lease's holder ("" when released or absent).
func (k *cluster) leaseHolder(t *testing.T, ns, name string) string {
	t.Helper()
	l := &unstructured.Unstructured{}
	l.SetAPIVersion("coordination.k8s.io/v1")
	l.SetKind("Lease")
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, l); err != nil {
		return ""
	}
	h, _, _ := unstructured.NestedString(l.Object, "spec", "holderIdentity")
	return h
}

// TestProcessReleasesLease: `kvgate serve --igwc` as its own process, stopped
// with SIGTERM as the kubelet does, exits 0 with the status Lease released,
// and a second process takes status over within 2 s.
func TestProcessReleasesLease(t *testing.T) {
	k := startCluster(t)
	const ns = "procs"
	k.namespace(t, ns)
	if err := k.c.Create(context.Background(), igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "s", ModelName: model, Endpoints: []string{"127.0.0.1:1"}})); err != nil {
		t.Fatal(err)
	}
	start := func() (*exec.Cmd, *logtest.Buffer) {
		return k.serveProcess(t, ns+"/gw", "--pre-stop", "0s", "--drain-timeout", "1s")
	}
	a, _ := start()
	var first string
	waittest.Until(t, 30*time.Second, "the first process to hold the Lease", func() bool {
		first = k.leaseHolder(t, ns, "kvgate-status-gw")
		return first != ""
	})
	b, bout := start()
	waittest.Until(t, 30*time.Second, "the second process to watch the cluster", func() bool {
		return strings.Contains(bout.String(), "watching the cluster")
	})
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("kvgate after SIGTERM: %v", err)
	}
	exited := time.Now()
	var second string
	waittest.Until(t, 5*time.Second, "the second process to take the Lease", func() bool {
		second = k.leaseHolder(t, ns, "kvgate-status-gw")
		return second != "" && second != first
	})
	took := time.Since(exited)
	t.Logf("SIGTERM → exit → Lease %s → %s %v after the exit", first, second, took)
	if took > 2*time.Second {
		t.Errorf("status handed over %v after the first process exited, want < 2s", took)
	}
	_ = b
}
