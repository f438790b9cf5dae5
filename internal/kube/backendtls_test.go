package kube

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestPoolOverTLS: a scheduler with appProtocol https over an InferencePool
// (whose appProtocol is http, its default: the InferencePool API has no
// https) reaches the pool's pods over TLS, checked for the service name the
// certificate carries; a pool that says h2c, HTTP/2 without TLS, contradicts
// it and leaves the scheduler pending with the reason. A CA file that is not
// there refuses the configuration with the field named.
func TestPoolOverTLS(t *testing.T) {
	k := startCluster(t)
	const ns = "tls"
	k.namespace(t, ns)
	port := freePorts(t, "127.0.0.2", 1)[0]
	ca := simtest.NewCA(t, "models")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	simtest.WriteFile(t, caFile, ca.PEM)
	addr := fmt.Sprintf("127.0.0.2:%d", port)
	simtest.StartAt(t, simserver.Options{Model: model, TLS: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "vllm.tls.svc")}}}, addr)
	k.pod(t, ns, "vllm-0", "127.0.0.2", true, map[string]string{"pool": "vllm"})
	k.installPools(t)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "vllm", "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"pool": "vllm"}},
			"targetPorts": []any{map[string]any{"number": int64(port)}}},
	}}
	if err := k.c.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, k, types.NamespacedName{Namespace: ns, Name: "gw"}, Options{PoolPollInterval: 200 * time.Millisecond})
	sc := v1alpha1.SchedulerSpec{Name: "vllm", ModelName: model, PoolRef: "vllm", AppProtocol: v1alpha1.AppProtocolHTTPS,
		BackendTLS: &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: "vllm.tls.svc"}}
	if err := k.c.Create(context.Background(), igwc(ns, "gw", sc)); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the pod as an endpoint", func() bool { return endpointsOf(t, r.g.Host, "vllm") == addr })
	if got := spread(t, r.url, 5); got[addr] != 5 {
		t.Errorf("requests over TLS: %v", got)
	}
	if active, _, _ := r.g.Router().ConfigStatus(); active == nil || !active.Spec.Schedulers[0].HTTPS() {
		t.Errorf("the scheduler's https gave way to the pool's default http: %+v", active)
	}
	waittest.Until(t, 10*time.Second, "status Ready", func() bool {
		st := k.status(t, ns, "gw")
		return condition(st, "Ready").Status == "True" && st.ReadyEndpoints == 1
	})

	// A CA file that is not there refuses the edit, naming the field; the
	// last accepted configuration keeps serving over TLS.
	key := types.NamespacedName{Namespace: ns, Name: "gw"}
	k.edit(t, key, func(c *v1alpha1.InferenceGatewayConfig) {
		c.Spec.Schedulers[0].BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile + ".missing", ServerName: "vllm.tls.svc"}
	})
	waittest.Until(t, 10*time.Second, "the edit refused", func() bool {
		a := condition(k.status(t, ns, "gw"), "Accepted")
		return a.Status == "False" && strings.Contains(a.Message, "spec.schedulers[0].backendTLS.caFile")
	})
	if got := spread(t, r.url, 3); got[addr] != 3 {
		t.Errorf("after the refused edit: %v", got)
	}
	k.edit(t, key, func(c *v1alpha1.InferenceGatewayConfig) {
		c.Spec.Schedulers[0].BackendTLS = &v1alpha1.BackendTLSSpec{CAFile: caFile, ServerName: "vllm.tls.svc"}
	})
	waittest.Until(t, 10*time.Second, "the fix accepted", func() bool { return condition(k.status(t, ns, "gw"), "Accepted").Status == "True" })

	var got unstructured.Unstructured
	got.SetGroupVersionKind(pool.GroupVersionKind())
	if err := k.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "vllm"}, &got); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(got.Object, "kubernetes.io/h2c", "spec", "appProtocol"); err != nil {
		t.Fatal(err)
	}
	if err := k.c.Update(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the scheduler pending on the contradiction", func() bool {
		st := k.status(t, ns, "gw")
		return len(st.Schedulers) == 1 && len(st.Schedulers[0].Conditions) == 1 && st.Schedulers[0].Conditions[0].Reason == "InvalidInferencePool" &&
			strings.Contains(st.Schedulers[0].Conditions[0].Message, "https")
	})
}
