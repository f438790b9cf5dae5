package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/waittest"
)

const model = "meta-llama/Llama-3.1-8B-Instruct"

var quiet = slog.New(slog.DiscardHandler)

// clientLogs holds what controller-runtime and client-go log at WARN and
// above: their loggers are process-wide, and swapping them while informers
// run is a race.
var clientLogs = &logtest.Buffer{}

func TestMain(m *testing.M) {
	SetLoggers(slog.New(slog.NewTextHandler(clientLogs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}

// cluster is a real kube-apiserver and etcd (built by hack/envtest-bins.sh), with
// kvgate's CRD installed (and the InferencePool CRD when a test installs it).
type cluster struct {
	cfg *rest.Config
	c   client.Client
}

// poolCRD is the InferencePool CRD kvgate ships.
var poolCRD = filepath.Join("..", "..", "config", "crd", "inferencepool")

func startCluster(t *testing.T) *cluster {
	t.Helper()
	env := &envtest.Environment{
		BinaryAssetsDirectory: testenv.Require(t, testenv.Kube),
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{cfg: cfg, c: c}
}

func (k *cluster) namespace(t *testing.T, name string) {
	t.Helper()
	if err := k.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// pod creates a model-server pod and, as a kubelet would, sets its IP and
// readiness.
func (k *cluster) pod(t *testing.T, ns, name, ip string, ready bool, lbls map[string]string) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	if err := k.c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	k.setReady(t, ns, name, ip, ready)
}

func (k *cluster) setReady(t *testing.T, ns, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	if err := k.c.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

// servers runs simulated model servers on 127.0.0.<2..> at one port, as pods of
// one deployment would be.
func servers(t *testing.T, n int) (ips []string, port int) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		ips = ips[:0]
		ok := true
		for i := range n {
			ip := fmt.Sprintf("127.0.0.%d", i+2)
			if l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, port)); err != nil {
				ok = false
				break
			} else {
				_ = l.Close()
			}
			ips = append(ips, ip)
		}
		if ok {
			break
		}
	}
	for _, ip := range ips {
		simtest.StartAt(t, simserver.Options{Model: model}, fmt.Sprintf("%s:%d", ip, port))
	}
	return ips, port
}

// countingGateway counts the configurations applied to a gateway.
type countingGateway struct {
	*host.Host
	applied atomic.Int64
}

func (c *countingGateway) Apply(cfg *v1alpha1.InferenceGatewayConfig) error {
	c.applied.Add(1)
	if cfg.Spec.Gateway.Diagnostics == nil {
		// The tests read which pod served (x-kvgate-endpoint), off by default.
		cfg = cfg.DeepCopy()
		cfg.Spec.Gateway.Diagnostics = &v1alpha1.DiagnosticsSpec{Expose: true}
	}
	return c.Host.Apply(cfg)
}

// endpointsOf lists a scheduler's endpoints as the gateway's /debug/fleet shows
// them, comma-separated.
func endpointsOf(t *testing.T, g *host.Host, scheduler string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	// As a reader on the pod itself: the admin listener's default answers
	// /debug/* on loopback only.
	req := httptest.NewRequest(http.MethodGet, "http://localhost/debug/fleet", nil)
	req.RemoteAddr = "127.0.0.1:40000"
	g.AdminHandler().ServeHTTP(rec, req)
	var pools []struct {
		Scheduler string `json:"scheduler"`
		Endpoints []struct {
			Address string `json:"address"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &pools); err != nil {
		t.Fatalf("/debug/fleet: %v", err)
	}
	var addrs []string
	for _, p := range pools {
		if p.Scheduler == scheduler {
			for _, e := range p.Endpoints {
				addrs = append(addrs, e.Address)
			}
		}
	}
	return strings.Join(addrs, ",")
}

// replica is one kvgate replica: a gateway fed by the controller.
type replica struct {
	g       *countingGateway
	url     string // the OpenAI API
	logs    *logtest.Buffer
	stop    context.CancelFunc // stops the controller (the gateway goes on)
	stopped chan struct{}      // closed when the controller has returned, err with its result
	err     error
}

// gatewayUnderTest runs a gateway fed by the controller until the test ends.
func gatewayUnderTest(t *testing.T, k *cluster, target types.NamespacedName) (*countingGateway, string) {
	t.Helper()
	r := startReplica(t, k, target, Options{})
	return r.g, r.url
}

// startReplica runs a replica with o (its target, gateway and log filled in)
// until the test ends or r.stop.
func startReplica(t *testing.T, k *cluster, target types.NamespacedName, o Options) *replica {
	t.Helper()
	r := &replica{g: &countingGateway{Host: host.New(host.CoreOptions{Logger: quiet})}, logs: &logtest.Buffer{}, stopped: make(chan struct{})}
	t.Cleanup(r.g.Close)
	srv := httptest.NewServer(gateway.New(r.g.Router(), gateway.Options{Logger: quiet}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	o.Target, o.Gateway, o.LeaderElection = target, r.g, true
	o.Log = slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		r.err = Start(ctx, k.cfg, o)
		close(r.stopped)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.stopped
		if r.err != nil {
			t.Errorf("controller: %v", r.err)
		}
		if t.Failed() {
			t.Logf("replica log:\n%s", r.logs.String())
		}
	})
	return r
}

func igwc(ns, name string, schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
	return &v1alpha1.InferenceGatewayConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true}, Schedulers: schedulers}}
}

// post sends one chat request through the gateway and returns the status (0 when
// the request did not get an answer) and the endpoint that served it.
func post(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Kvgate-Endpoint")
}

// edit changes the named config, retrying when the controller's status write got
// there first.
func (k *cluster) edit(t *testing.T, key types.NamespacedName, change func(*v1alpha1.InferenceGatewayConfig)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.InferenceGatewayConfig
		if err := k.c.Get(context.Background(), key, &cur); err != nil {
			return err
		}
		change(&cur)
		return k.c.Update(context.Background(), &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (k *cluster) status(t *testing.T, ns, name string) v1alpha1.InferenceGatewayConfigStatus {
	t.Helper()
	var cfg v1alpha1.InferenceGatewayConfig
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Status
}

func condition(st v1alpha1.InferenceGatewayConfigStatus, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// TestPodsBecomeEndpoints walks a pool through its life: pods labelled for the
// scheduler become endpoints when ready and take traffic; one set NotReady stops
// taking traffic within a second; a weights edit applies without a failed request; with
// no pod left the status says so.
func TestPodsBecomeEndpoints(t *testing.T) {
	k := startCluster(t)
	const ns = "models"
	k.namespace(t, ns)
	ips, port := servers(t, 2)
	target := types.NamespacedName{Namespace: ns, Name: "kvgate"}
	g, base := gatewayUnderTest(t, k, target)
	ctx := context.Background()

	cfg := igwc(ns, "kvgate", v1alpha1.SchedulerSpec{Name: "llama", ModelName: model, TargetPort: ptr(int32(port)),
		ModelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llama"}}})
	if err := k.c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// A selector that matches nothing is not Ready, and says why.
	waittest.Until(t, 10*time.Second, "status NoMatchingPods", func() bool {
		st := k.status(t, ns, "kvgate")
		return condition(st, "Accepted").Status == metav1.ConditionTrue && condition(st, "Ready").Reason == "NoReadyEndpoints" &&
			strings.Contains(condition(st, "Ready").Message, "no pod in namespace models matches selector") && len(st.Schedulers) == 1 && st.Schedulers[0].RolloutState == "Pending"
	})
	if code, _ := post(t, base); code != http.StatusServiceUnavailable {
		t.Errorf("no endpoints: status %d, want 503", code)
	}

	labels := map[string]string{"app": "llama"}
	k.pod(t, ns, "llama-0", ips[0], true, labels)
	k.pod(t, ns, "llama-1", ips[1], true, labels)
	k.pod(t, ns, "other", "127.0.0.9", true, map[string]string{"app": "qwen"}) // not selected
	waittest.Until(t, 10*time.Second, "both pods served", func() bool {
		seen := map[string]bool{}
		for range 20 {
			if code, ep := post(t, base); code == http.StatusOK {
				seen[ep] = true
			}
		}
		return len(seen) == 2
	})
	waittest.Until(t, 10*time.Second, "status Ready with 2 endpoints", func() bool {
		st := k.status(t, ns, "kvgate")
		return condition(st, "Ready").Status == metav1.ConditionTrue && st.Schedulers[0].Endpoints == 2 &&
			st.Schedulers[0].RolloutState == "Available" && st.ObservedGeneration == 1
	})
	// An event that changes nothing served (another app's pod) applies nothing:
	// pools, transports and pickers stay as they are.
	before := g.applied.Load()
	var cur v1alpha1.InferenceGatewayConfig
	if err := k.c.Get(ctx, target, &cur); err != nil {
		t.Fatal(err)
	}
	version := cur.ResourceVersion
	k.pod(t, ns, "unrelated", "127.0.0.10", true, map[string]string{"app": "other"})
	time.Sleep(500 * time.Millisecond)
	if n := g.applied.Load() - before; n != 0 {
		t.Errorf("an unrelated pod caused %d configuration applies", n)
	}
	// Nor a status write: the status it would write is the one already there.
	if err := k.c.Get(ctx, target, &cur); err != nil || cur.ResourceVersion != version {
		t.Errorf("an unrelated pod rewrote the status: resource version %s → %s (%v)", version, cur.ResourceVersion, err)
	}

	// NotReady: out of rotation within a second.
	gone := fmt.Sprintf("%s:%d", ips[0], port)
	start := time.Now()
	k.setReady(t, ns, "llama-0", ips[0], false)
	waittest.Until(t, time.Second, "the NotReady pod to leave the pool", func() bool { return !strings.Contains(endpointsOf(t, g.Host, "llama"), gone) })
	t.Logf("NotReady pod out of rotation after %v", time.Since(start))
	for range 10 {
		if code, ep := post(t, base); code != http.StatusOK || ep == gone {
			t.Fatalf("after NotReady: status %d from %s", code, ep)
		}
	}
	k.setReady(t, ns, "llama-0", ips[0], true)
	waittest.Until(t, 5*time.Second, "the pod back", func() bool { return strings.Contains(endpointsOf(t, g.Host, "llama"), gone) })

	// A weights edit under load: no request fails.
	var failed, sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, _ := post(t, base)
				sent.Add(1)
				if code != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	two := int32(2)
	k.edit(t, target, func(c *v1alpha1.InferenceGatewayConfig) {
		c.Spec.Schedulers[0].Weights = &v1alpha1.Weights{Queue: &two}
	})
	waittest.Until(t, 10*time.Second, "generation 2 observed", func() bool { return k.status(t, ns, "kvgate").ObservedGeneration == 2 })
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || sent.Load() < 10 {
		t.Fatalf("weights edit: %d of %d requests failed", failed.Load(), sent.Load())
	}

	// Then the pods go: no endpoints, and the status says so. (Rejected edits
	// are TestRejectedEditFollowsPods'.)
	start = time.Now()
	for _, name := range []string{"llama-0", "llama-1"} {
		if err := k.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}
	waittest.Until(t, time.Second, "no endpoints after deletion", func() bool { return endpointsOf(t, g.Host, "llama") == "" })
	t.Logf("deleted pods out of rotation after %v", time.Since(start))
	if code, _ := post(t, base); code != http.StatusServiceUnavailable {
		t.Errorf("no pods left: status %d, want 503", code)
	}
	waittest.Until(t, 10*time.Second, "status not ready", func() bool {
		return condition(k.status(t, ns, "kvgate"), "Ready").Status == metav1.ConditionFalse
	})
}

// TestInferencePool: a scheduler whose pool is an upstream InferencePool routes
// to the pods its selector picks, at its target port — through two gateway
// replicas at once, each reconciling on its own (one of them writes status).
func TestInferencePool(t *testing.T) {
	const ns = "pools"
	k, want, _ := startPoolCluster(t, ns)
	ctx := context.Background()
	_, base := gatewayUnderTest(t, k, types.NamespacedName{Namespace: ns, Name: "gw"})
	_, base2 := gatewayUnderTest(t, k, types.NamespacedName{Namespace: ns, Name: "gw"})
	if err := k.c.Create(ctx, igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "llama", ModelName: model, PoolRef: "llama-pool"})); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{base, base2} {
		waittest.Until(t, 10*time.Second, "traffic to the pool's pod through "+b, func() bool {
			code, ep := post(t, b)
			return code == http.StatusOK && ep == want
		})
	}
	waittest.Until(t, 10*time.Second, "status from the leader", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Ready").Status == metav1.ConditionTrue && len(st.Schedulers) == 1 && st.Schedulers[0].Endpoints == 1
	})
}

// startPoolCluster starts a cluster serving InferencePools with, in
// namespace ns, the pool llama-pool of one ready pod: a model server at
// endpoint, listening on port.
func startPoolCluster(t *testing.T, ns string) (k *cluster, endpoint string, port int) {
	t.Helper()
	k = startCluster(t)
	k.namespace(t, ns)
	k.installPools(t)
	ips, port := servers(t, 1)
	k.llamaPool(t, ns, port)
	k.pod(t, ns, "p0", ips[0], true, map[string]string{"pool": "llama"})
	return k, fmt.Sprintf("%s:%d", ips[0], port), port
}

// llamaPool creates the InferencePool llama-pool: the pods labelled
// pool=llama, at port.
func (k *cluster) llamaPool(t *testing.T, ns string, port int) {
	t.Helper()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama-pool", "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"pool": "llama"}},
			"targetPorts": []any{map[string]any{"number": int64(port)}}},
	}}
	if err := k.c.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
}

// TestInferencePoolCRDDeleted: deleting the InferencePool CRD under two
// replicas costs each one WARN line and no ERROR (an informer left to fail
// logged one per retry until the CRD returned); installed again, both
// replicas route to the pool's pods within a bound (the failing informer's
// backoff once made them recover seconds apart).
func TestInferencePoolCRDDeleted(t *testing.T) {
	const ns = "pools"
	k, want, port := startPoolCluster(t, ns)
	const poll = 500 * time.Millisecond
	target := types.NamespacedName{Namespace: ns, Name: "gw"}
	replicas := []*replica{startReplica(t, k, target, Options{PoolPollInterval: poll}), startReplica(t, k, target, Options{PoolPollInterval: poll})}
	if err := k.c.Create(context.Background(), igwc(ns, "gw", v1alpha1.SchedulerSpec{Name: "llama", ModelName: model, PoolRef: "llama-pool"})); err != nil {
		t.Fatal(err)
	}
	served := func(bound time.Duration) {
		t.Helper()
		for _, r := range replicas {
			waittest.Until(t, bound, "traffic to the pool's pod through "+r.url, func() bool {
				code, ep := post(t, r.url)
				return code == http.StatusOK && ep == want
			})
		}
	}
	served(10 * time.Second)

	mark := len(clientLogs.String())
	if err := envtest.UninstallCRDs(k.cfg, envtest.CRDInstallOptions{Paths: []string{poolCRD}, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	d := discovery.NewDiscoveryClientForConfigOrDie(k.cfg)
	waittest.Until(t, 30*time.Second, "the InferencePool CRD gone", func() bool {
		ok, err := poolsServed(d)
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		return err == nil && !ok && apierrors.IsNotFound(k.c.Get(context.Background(), types.NamespacedName{Name: poolCRDName}, crd))
	})
	time.Sleep(5 * time.Second) // long enough for several of a failing informer's retries
	if logged := clientLogs.String()[mark:]; strings.Contains(logged, "level=ERROR") {
		t.Errorf("controller-runtime or client-go logged errors while the CRD was away:\n%s", logged)
	}
	const gone = "no longer serves the InferencePool resource"
	for i, r := range replicas {
		if n := strings.Count(r.logs.String(), gone); n != 1 {
			t.Errorf("replica %d said %d times that the resource went, want once", i, n)
		}
		if strings.Contains(r.logs.String(), "level=ERROR") {
			t.Errorf("replica %d logged an error while the CRD was away", i)
		}
	}

	start := time.Now()
	k.installPools(t)
	k.llamaPool(t, ns, port)
	served(3*poll + 2*time.Second)
	t.Logf("both replicas served the pool again %v after its CRD was installed again", time.Since(start).Round(time.Millisecond))
}
