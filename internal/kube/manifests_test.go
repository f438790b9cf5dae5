package kube

// The manifests kvgate ships — the helm chart (deploy/helm/kvgate) and the
// kustomize base (config/) — checked against a real API server.

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	poolv1 "github.com/kvgate/kvgate/api/inferencepool/v1"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/waittest"
)

var (
	repoRoot = filepath.Join("..", "..")
	chartDir = filepath.Join(repoRoot, "deploy", "helm", "kvgate")
)

const (
	poolCRDFile = "inference.networking.k8s.io_inferencepools.yaml"
	poolCRDName = "inferencepools.inference.networking.k8s.io"
)

// decode splits a YAML stream into its objects, leaving out empty documents.
func decodeYAML(t *testing.T, what string, raw []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split("\n"+string(raw), "\n---") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, doc)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	return objs
}

func kinds(objs []*unstructured.Unstructured) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.GetKind())
	}
	return ks
}

// named converts the object of kind and name in objs into into, failing the
// test when there is none.
func named(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s (kinds: %v)", kind, name, kinds(objs))
}

// sharedState reads the gateway container's shared-state flag and the
// Secret its Redis password comes from ("" for none).
func sharedState(t *testing.T, objs []*unstructured.Unstructured) (redis, secret string) {
	t.Helper()
	var d appsv1.Deployment
	named(t, objs, "Deployment", "kvgate", &d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--shared-state-redis="); ok {
			redis = v
		}
	}
	for _, e := range c.Env {
		if e.Name == "KVGATE_SHARED_STATE_PASSWORD" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secret = e.ValueFrom.SecretKeyRef.Name
		}
	}
	return redis, secret
}

// one returns the one object of kind in objs, failing the test unless there is
// exactly one; into, when not nil, receives it converted to a typed object.
func one(t *testing.T, objs []*unstructured.Unstructured, kind string, into any) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1 (kinds: %v)", len(found), kind, kinds(objs))
	}
	if into != nil {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, into); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	return found[0]
}

// dryRun sends obj to the API server as a strict server-side dry run, in ns when
// its kind is namespaced. A cluster-scoped object the cluster already has (the
// namespace, or a CRD the test cluster was started with) passed validation
// before the API server found the name taken.
func (k *cluster) dryRun(t *testing.T, ns string, obj *unstructured.Unstructured) {
	t.Helper()
	namespaced, err := k.c.IsObjectNamespaced(obj)
	if err != nil {
		t.Errorf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		return
	}
	if namespaced {
		obj.SetNamespace(ns)
	}
	err = k.c.Create(context.Background(), obj.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))
	if err != nil && (namespaced || !apierrors.IsAlreadyExists(err)) {
		t.Errorf("%s %s: server-side dry run: %v", obj.GetKind(), obj.GetName(), err)
	}
}

// allows reports whether role grants every one of verbs on resource in group.
func allows(role rbacv1.Role, group, resource string, verbs ...string) bool {
	for _, v := range verbs {
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, v)
		}) {
			return false
		}
	}
	return true
}

// secretNames lists the Secrets a Role grants by name, and whether it
// grants any Secret at all.
func secretNames(role rbacv1.Role) ([]string, bool) {
	var names []string
	granted := false
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "secrets") {
			granted = true
			names = append(names, r.ResourceNames...)
		}
	}
	return names, granted
}

// helmCmd runs helm with its caches and configuration in the test's own
// folder, not the user's.
func helmCmd(t *testing.T, helm string, args ...string) *exec.Cmd {
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	return cmd
}

// chartConfig makes the chart create an InferenceGatewayConfig too.
var chartConfig = []string{"--set-json", `config.spec={"bbr":{"enabled":true},"schedulers":[{"name":"llama","modelName":"m","modelSelector":{"matchLabels":{"app":"llama"}}}]}`}

// TestHelmChart renders the chart with helm template, with the values each case
// sets, and sends every object to the API server as a strict server-side dry
// run: the chart is valid against a real cluster's schemas, kvgate's CRD's included.
// The InferencePool CRD the chart renders on request is created for real, and
// the API server then takes valid InferencePools and refuses invalid ones.
func TestHelmChart(t *testing.T) {
	helm := testenv.Require(t, testenv.Helm)
	k := startCluster(t)
	const ns = "chart"
	k.namespace(t, ns)
	base := []string{"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "InferenceGatewayConfig"}
	cases := []struct {
		name   string
		flags  []string // besides chartConfig
		want   []string // kinds the chart must render
		absent []string // kinds it must not
		check  func(t *testing.T, objs []*unstructured.Unstructured)
	}{{
		name: "defaults", want: append(base, "PodDisruptionBudget"), absent: []string{"CustomResourceDefinition", "ServiceMonitor"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var d appsv1.Deployment
			named(t, objs, "Deployment", "kvgate", &d)
			if v, m := d.Spec.Template.Spec.Volumes, d.Spec.Template.Spec.Containers[0].VolumeMounts; len(v) != 0 || len(m) != 0 {
				t.Errorf("volumes %+v and mounts %+v by default", v, m)
			}
			var role rbacv1.Role
			one(t, objs, "Role", &role)
			if !allows(role, "", "events", "create", "patch") || !allows(role, "events.k8s.io", "events", "create", "patch") {
				t.Errorf("the Role does not let kvgate create and patch core and events.k8s.io events: %+v", role.Rules)
			}
			if names, ok := secretNames(role); ok {
				t.Errorf("no TLS, and the Role grants Secrets %v", names)
			}
		},
	}, {
		name: "a TLS Secret: the Role reads that one", flags: []string{"--set", "tls.secretName=api-tls"}, want: base,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var role rbacv1.Role
			one(t, objs, "Role", &role)
			if names, _ := secretNames(role); !slices.Equal(names, []string{"api-tls"}) || !allows(role, "", "secrets", "get", "list", "watch") {
				t.Errorf("the Role grants Secrets %v (%+v), want get, list and watch on api-tls only", names, role.Rules)
			}
		},
	}, {
		name: "the chart's config names a TLS Secret", flags: []string{"--set-json", `config.spec.tls={"secretName":"from-spec"}`}, want: base,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var role rbacv1.Role
			one(t, objs, "Role", &role)
			if names, _ := secretNames(role); !slices.Equal(names, []string{"from-spec"}) {
				t.Errorf("the Role grants Secrets %v, want from-spec", names)
			}
		},
	}, {
		name: "one replica, no PodDisruptionBudget and no shared state", flags: []string{"--set", "replicas=1"},
		want: base, absent: []string{"PodDisruptionBudget", "Secret"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var d appsv1.Deployment
			one(t, objs, "Deployment", &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
				t.Errorf("deployment replicas %v, want 1", d.Spec.Replicas)
			}
			if redis, _ := sharedState(t, objs); redis != "" {
				t.Errorf("one replica shares state through %s", redis)
			}
		},
	}, {
		name: "two replicas share state through a bundled Redis", want: append(base, "Secret"),
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if redis, secret := sharedState(t, objs); redis != "kvgate-redis:6379" || secret != "kvgate-redis" {
				t.Errorf("shared state through %q with the password of Secret %q, want kvgate-redis:6379 and kvgate-redis", redis, secret)
			}
			var r appsv1.Deployment
			named(t, objs, "Deployment", "kvgate-redis", &r)
			var svc corev1.Service
			named(t, objs, "Service", "kvgate-redis", &svc)
			if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.Selector["app.kubernetes.io/name"] != r.Spec.Template.Labels["app.kubernetes.io/name"] {
				t.Errorf("the Redis Service %+v does not select its Deployment", svc.Spec)
			}
		},
	}, {
		name: "a bundled Redis with an existing Secret", flags: []string{"--set", "sharedState.existingSecret=redis-creds"},
		want: base, absent: []string{"Secret"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if _, secret := sharedState(t, objs); secret != "redis-creds" {
				t.Errorf("kvgate reads the password of Secret %q, want redis-creds", secret)
			}
			var r appsv1.Deployment
			named(t, objs, "Deployment", "kvgate-redis", &r)
			env := r.Spec.Template.Spec.Containers[0].Env
			if len(env) == 0 || env[0].ValueFrom == nil || env[0].ValueFrom.SecretKeyRef == nil || env[0].ValueFrom.SecretKeyRef.Name != "redis-creds" {
				t.Errorf("the bundled Redis takes its password from %+v, not redis-creds", env)
			}
		},
	}, {
		name: "an external Redis", flags: []string{"--set", "sharedState.redis=redis.infra:6380", "--set", "sharedState.existingSecret=redis-creds"},
		want: base, absent: []string{"Secret"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if redis, secret := sharedState(t, objs); redis != "redis.infra:6380" || secret != "redis-creds" {
				t.Errorf("shared state through %q with Secret %q", redis, secret)
			}
			for _, o := range objs {
				if o.GetName() == "kvgate-redis" {
					t.Errorf("an external Redis, and the chart renders %s kvgate-redis", o.GetKind())
				}
			}
		},
	}, {
		name: "two replicas, sharing off", flags: []string{"--set", "sharedState.enabled=false"},
		want: base, absent: []string{"Secret"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if redis, _ := sharedState(t, objs); redis != "" {
				t.Errorf("sharing off, and the replicas share state through %s", redis)
			}
		},
	}, {
		name: "two replicas, a PodDisruptionBudget", flags: []string{"--set", "replicas=2", "--set", "podDisruptionBudget.minAvailable=1"},
		want: append(base, "PodDisruptionBudget"),
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var pdb policyv1.PodDisruptionBudget
			one(t, objs, "PodDisruptionBudget", &pdb)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("minAvailable %v, want 1", pdb.Spec.MinAvailable)
			}
		},
	}, {
		name: "a LoadBalancer API keeps the admin port inside", flags: []string{"--set", "service.type=LoadBalancer"},
		want: base,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if o.GetKind() != "Service" {
					continue
				}
				typ, _, _ := unstructured.NestedString(o.Object, "spec", "type")
				ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
				for _, p := range ports {
					if name := p.(map[string]any)["name"]; name == "admin" && typ != "ClusterIP" {
						t.Errorf("Service %s exposes the admin port as %s", o.GetName(), typ)
					}
				}
			}
		},
	}, {
		name: "extra volumes: a CA bundle for backendTLS",
		flags: []string{"--set-json", `extraVolumes=[{"name":"model-ca","configMap":{"name":"model-ca"}}]`,
			"--set-json", `extraVolumeMounts=[{"name":"model-ca","mountPath":"/etc/kvgate/model-ca","readOnly":true}]`},
		want: base,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			var d appsv1.Deployment
			named(t, objs, "Deployment", "kvgate", &d)
			pod := d.Spec.Template.Spec
			if len(pod.Volumes) != 1 || pod.Volumes[0].ConfigMap == nil || pod.Volumes[0].ConfigMap.Name != "model-ca" {
				t.Errorf("volumes %+v, want the model-ca ConfigMap", pod.Volumes)
			}
			if m := pod.Containers[0].VolumeMounts; len(m) != 1 || m[0].Name != "model-ca" || m[0].MountPath != "/etc/kvgate/model-ca" || !m[0].ReadOnly {
				t.Errorf("kvgate's mounts %+v, want model-ca read-only at /etc/kvgate/model-ca", m)
			}
		},
	}, {
		name: "ServiceMonitor enabled, cluster without its CRD", flags: []string{"--set", "serviceMonitor.enabled=true"},
		want: base, absent: []string{"ServiceMonitor"},
	}, {
		name:  "ServiceMonitor enabled, cluster with its CRD",
		flags: []string{"--set", "serviceMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"},
		want:  append(base, "ServiceMonitor"),
	}, {
		name: "InferencePool CRD", flags: []string{"--set", "inferencePool.installCRD=true"},
		want: append(base, "CustomResourceDefinition"),
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			crd := one(t, objs, "CustomResourceDefinition", nil)
			if crd.GetName() != poolCRDName || crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
				t.Fatalf("CRD %s, annotations %v: want %s, kept on uninstall", crd.GetName(), crd.GetAnnotations(), poolCRDName)
			}
			k.installPoolCRD(t, crd)
			k.checkPools(t, ns)
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template", "kvgate", chartDir, "--namespace", ns}, chartConfig...)
			out, err := helmCmd(t, helm, append(args, c.flags...)...).Output()
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs := decodeYAML(t, "helm template", out)
			got := kinds(objs)
			for _, w := range c.want {
				if !slices.Contains(got, w) {
					t.Errorf("chart renders no %s (rendered %v)", w, got)
				}
			}
			for _, a := range c.absent {
				if slices.Contains(got, a) {
					t.Errorf("chart renders a %s (rendered %v)", a, got)
				}
			}
			for _, obj := range objs {
				switch obj.GetKind() {
				case "ServiceMonitor": // the test cluster has no Prometheus Operator CRDs
				case "CustomResourceDefinition": // created for real by the case's check
				default:
					k.dryRun(t, ns, obj)
				}
			}
			if c.check != nil {
				c.check(t, objs)
			}
		})
	}

	// What helm install prints after it installed: the notes say what the chart
	// left out, against the cluster's own API discovery (no ServiceMonitor).
	t.Run("NOTES.txt", func(t *testing.T) {
		args := append([]string{"install", "kvgate", chartDir, "--namespace", ns, "--dry-run=server", "--kubeconfig", k.kubeconfig(t),
			"--set", "replicas=1", "--set", "serviceMonitor.enabled=true"}, chartConfig...)
		out, err := helmCmd(t, helm, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm install --dry-run=server: %v\n%s", err, out)
		}
		manifest, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
		if !ok {
			t.Fatalf("no NOTES in\n%s", out)
		}
		if strings.Contains(manifest, "kind: ServiceMonitor") || strings.Contains(manifest, "kind: PodDisruptionBudget") {
			t.Errorf("manifest has a ServiceMonitor or PodDisruptionBudget:\n%s", manifest)
		}
		for _, want := range []string{"kvgate serves the InferenceGatewayConfig chart/kvgate.", "No PodDisruptionBudget", "No ServiceMonitor"} {
			if !strings.Contains(notes, want) {
				t.Errorf("NOTES lack %q:\n%s", want, notes)
			}
		}
	})
}

// kubeconfig writes a kubeconfig file for the test cluster, for tools such as
// helm that talk to it on their own.
func (k *cluster) kubeconfig(t *testing.T) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: k.cfg.Host, CertificateAuthorityData: k.cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: k.cfg.CertData, ClientKeyData: k.cfg.KeyData, Token: k.cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// poolClient is a client that knows kvgate's InferencePool types.
func (k *cluster) poolClient(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := poolv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(k.cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installPoolCRD creates crd for real, in place of any InferencePool CRD the
// cluster has, and waits until the API server serves InferencePools under its
// schema: the defaults it sets show that it does.
func (k *cluster) installPoolCRD(t *testing.T, crd *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var cur unstructured.Unstructured
	cur.SetGroupVersionKind(crd.GroupVersionKind())
	switch err := k.c.Get(ctx, types.NamespacedName{Name: crd.GetName()}, &cur); {
	case apierrors.IsNotFound(err):
		err = k.c.Create(ctx, crd, client.FieldValidation("Strict"))
		if err != nil {
			t.Fatalf("creating the InferencePool CRD: %v", err)
		}
	case err != nil:
		t.Fatal(err)
	default:
		crd.SetResourceVersion(cur.GetResourceVersion())
		if err := k.c.Update(ctx, crd, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("replacing the InferencePool CRD: %v", err)
		}
	}
	pc := k.poolClient(t)
	waittest.Until(t, 20*time.Second, "the InferencePool CRD's schema in effect", func() bool {
		p := pool("probe", nil)
		p.Namespace = "default"
		return pc.Create(ctx, p, client.DryRunAll) == nil && p.Spec.AppProtocol == poolv1.AppProtocolHTTP
	})
}

// pool is a valid InferencePool, as change leaves it.
func pool(name string, change func(*poolv1.InferencePoolSpec)) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: poolv1.InferencePoolSpec{
			Selector:    poolv1.LabelSelector{MatchLabels: map[string]string{"app": "llama"}},
			TargetPorts: []poolv1.Port{{Number: 8000}, {Number: 8001}},
		},
	}
	if change != nil {
		change(&p.Spec)
	}
	return p
}

// checkPools: the API server, serving kvgate's InferencePool CRD, takes valid
// pools, filling in the upstream defaults, and refuses invalid ones naming the
// rule broken.
func (k *cluster) checkPools(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	pc := k.poolClient(t)
	epp := func(s *poolv1.InferencePoolSpec) {
		s.EndpointPickerRef = &poolv1.EndpointPickerRef{Name: "llama-epp", Port: &poolv1.Port{Number: 9002}}
	}
	p := pool("defaults", epp)
	p.Namespace = ns
	if err := pc.Create(ctx, p); err != nil {
		t.Fatalf("valid pool refused: %v", err)
	}
	var got poolv1.InferencePool
	if err := pc.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	e := got.Spec.EndpointPickerRef
	if got.Spec.AppProtocol != poolv1.AppProtocolHTTP || e == nil || e.Group == nil || *e.Group != "" || e.Kind != "Service" ||
		e.FailureMode != poolv1.FailClose || !slices.Equal(got.Spec.Ports(), []int32{8000, 8001}) {
		t.Errorf("stored pool %+v, endpointPickerRef %+v: want the defaults http, group \"\", kind Service, FailClose", got.Spec, e)
	}

	eight := func(s *poolv1.InferencePoolSpec) {
		s.TargetPorts = nil
		for i := range int32(8) {
			s.TargetPorts = append(s.TargetPorts, poolv1.Port{Number: 8000 + i})
		}
	}
	cases := []struct {
		name   string
		change func(*poolv1.InferencePoolSpec)
		refuse string // what the API server's answer says; "" when it takes the pool
	}{
		{"eight target ports, h2c", func(s *poolv1.InferencePoolSpec) { eight(s); s.AppProtocol = poolv1.AppProtocolH2C }, ""},
		{"endpoint picker not a Service, no port", func(s *poolv1.InferencePoolSpec) {
			g := "example.com"
			s.EndpointPickerRef = &poolv1.EndpointPickerRef{Group: &g, Kind: "Picker", Name: "p", FailureMode: poolv1.FailOpen}
		}, ""},
		{"nine target ports", func(s *poolv1.InferencePoolSpec) {
			eight(s)
			s.TargetPorts = append(s.TargetPorts, poolv1.Port{Number: 9000})
		}, "spec.targetPorts: Too many: 9"},
		{"no target ports", func(s *poolv1.InferencePoolSpec) { s.TargetPorts = nil }, "spec.targetPorts: Required value"},
		{"duplicate port", func(s *poolv1.InferencePoolSpec) {
			s.TargetPorts = []poolv1.Port{{Number: 8000}, {Number: 8001}, {Number: 8000}}
		}, "port number must be unique"},
		{"port 0", func(s *poolv1.InferencePoolSpec) { s.TargetPorts = []poolv1.Port{{Number: 0}} }, "spec.targetPorts[0].number"},
		{"endpoint picker kind Service without port", func(s *poolv1.InferencePoolSpec) {
			s.EndpointPickerRef = &poolv1.EndpointPickerRef{Kind: "Service", Name: "llama-epp"}
		}, "port is required when kind is 'Service' or unspecified"},
		{"endpoint picker kind unset without port", func(s *poolv1.InferencePoolSpec) {
			s.EndpointPickerRef = &poolv1.EndpointPickerRef{Name: "llama-epp"}
		}, "port is required when kind is 'Service' or unspecified"},
		{"empty selector", func(s *poolv1.InferencePoolSpec) { s.Selector.MatchLabels = nil }, "spec.selector.matchLabels: Required value"},
		{"unknown appProtocol", func(s *poolv1.InferencePoolSpec) { s.AppProtocol = "grpc" }, `spec.appProtocol: Unsupported value: "grpc"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pool(strings.ReplaceAll(strings.ReplaceAll(strings.ToLower(c.name), " ", "-"), ",", ""), c.change)
			p.Namespace = ns
			err := pc.Create(ctx, p)
			switch {
			case c.refuse == "" && err != nil:
				t.Errorf("valid pool refused: %v", err)
			case c.refuse != "" && err == nil:
				t.Errorf("invalid pool taken: %+v", p.Spec)
			case c.refuse != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.refuse)):
				t.Errorf("refused with %v, want an Invalid error saying %q", err, c.refuse)
			}
		})
	}
}

// kustomization is the part of a kustomization.yaml this test reads.
type kustomization struct {
	Namespace string   `json:"namespace"`
	Resources []string `json:"resources"`
}

func readKustomization(t *testing.T, dir string) kustomization {
	t.Helper()
	var kust kustomization
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err == nil {
		err = yaml.UnmarshalStrict(raw, &kust)
	}
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	return kust
}

// kustomizeFiles lists the manifest files kustomize builds dir from, following
// resources that are folders into their own kustomization.yaml.
func kustomizeFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	for _, r := range readKustomization(t, dir).Resources {
		p := filepath.Join(dir, r)
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			t.Fatalf("%s lists %s: %v", dir, r, err)
		case fi.IsDir():
			files = append(files, kustomizeFiles(t, p)...)
		default:
			files = append(files, p)
		}
	}
	return files
}

// resolve expands the $(VAR) references in arg from the container's env, as
// the kubelet does, for values given literally or as the pod's namespace.
func resolve(t *testing.T, arg string, env []corev1.EnvVar, podNamespace string) string {
	t.Helper()
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				continue
			}
			v = podNamespace
		}
		arg = strings.ReplaceAll(arg, "$("+e.Name+")", v)
	}
	if strings.Contains(arg, "$(") {
		t.Errorf("%q refers to a variable the test cannot resolve", arg)
	}
	return arg
}

// flagValue returns the value of --name in args, given as --name=value or as
// --name value.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// TestKustomizeBase checks the kustomize base (config/default and everything
// it includes, as kubectl apply -k would build it) and the sample config: each
// object is valid as a strict server-side dry run in the namespace the base
// sets; the deployment serves the sample, as installed there; the InferencePool
// CRD is left to config/crd/inferencepool, which installs it on its own.
func TestKustomizeBase(t *testing.T) {
	k := startCluster(t)
	root := filepath.Join(repoRoot, "config")
	kust := readKustomization(t, filepath.Join(root, "default"))
	if kust.Namespace != "kvgate-system" {
		t.Fatalf("config/default installs into %q, want kvgate-system", kust.Namespace)
	}
	k.namespace(t, kust.Namespace)
	files := kustomizeFiles(t, filepath.Join(root, "default"))
	var objs []*unstructured.Unstructured
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeYAML(t, f, raw)...)
	}
	samplePath := filepath.Join(root, "samples", "inferencegatewayconfig.yaml")
	raw, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	samples := decodeYAML(t, samplePath, raw)
	if len(samples) != 1 || samples[0].GetKind() != "InferenceGatewayConfig" {
		t.Fatalf("%s: want one InferenceGatewayConfig, have %v", samplePath, kinds(samples))
	}
	sample := samples[0]

	t.Run("valid in "+kust.Namespace, func(t *testing.T) {
		for _, obj := range append(slices.Clone(objs), sample) {
			k.dryRun(t, kust.Namespace, obj)
		}
		got := kinds(objs)
		for _, want := range []string{"Namespace", "CustomResourceDefinition", "Role", "RoleBinding", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"} {
			if !slices.Contains(got, want) {
				t.Errorf("config/default installs no %s (installs %v)", want, got)
			}
		}
	})

	t.Run("--igwc names the sample", func(t *testing.T) {
		var d appsv1.Deployment
		one(t, objs, "Deployment", &d)
		want := kust.Namespace + "/" + sample.GetName()
		for _, c := range d.Spec.Template.Spec.Containers {
			v, ok := flagValue(c.Args, "igwc")
			if !ok {
				t.Fatalf("container %s: no --igwc in %q", c.Name, c.Args)
			}
			if got := resolve(t, v, c.Env, kust.Namespace); got != want {
				t.Errorf("container %s serves --igwc %q (%q as the kubelet resolves it), want %q: %s installed into %s",
					c.Name, v, got, want, samplePath, kust.Namespace)
			}
		}
	})

	t.Run("Role writes events", func(t *testing.T) {
		var role rbacv1.Role
		one(t, objs, "Role", &role)
		if !allows(role, "", "events", "create", "patch") || !allows(role, "events.k8s.io", "events", "create", "patch") {
			t.Errorf("the Role does not let kvgate create and patch core and events.k8s.io events: %+v", role.Rules)
		}
	})

	t.Run("InferencePool CRD only from config/crd/inferencepool", func(t *testing.T) {
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" && o.GetName() == poolCRDName {
				t.Errorf("config/default installs the InferencePool CRD")
			}
		}
		dir := filepath.Join(root, "crd", "inferencepool")
		files := kustomizeFiles(t, dir)
		if len(files) != 1 || filepath.Base(files[0]) != poolCRDFile {
			t.Fatalf("%s builds from %v, want %s alone", dir, files, poolCRDFile)
		}
		raw, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		chartCopy, err := os.ReadFile(filepath.Join(chartDir, "files", poolCRDFile))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, chartCopy) {
			t.Errorf("%s and the chart's files/%s differ: run make generate", files[0], poolCRDFile)
		}
		crds := decodeYAML(t, files[0], raw)
		if len(crds) != 1 || crds[0].GetKind() != "CustomResourceDefinition" || crds[0].GetName() != poolCRDName {
			t.Fatalf("%s: want the CRD %s alone, have %v", files[0], poolCRDName, kinds(crds))
		}
		k.dryRun(t, "", crds[0])
	})
}

// TestHelmChartDashboardAndRules renders the chart's optional Grafana dashboard
// ConfigMap and PrometheusRule and checks they carry deploy/grafana's and
// deploy/prometheus's files unchanged, with the labels their consumers select on.
func TestHelmChartDashboardAndRules(t *testing.T) {
	helm := testenv.Require(t, testenv.Helm)
	dashboard, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "kvgate.json"))
	if err != nil {
		t.Fatal(err)
	}
	rulesFile, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "kvgate-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(rulesFile, &rules); err != nil {
		t.Fatal(err)
	}
	withRuleCRD := []string{"--api-versions", "monitoring.coreos.com/v1/PrometheusRule"}
	for _, c := range []struct {
		name             string
		flags            []string
		configMap, rules bool
	}{
		{name: "off by default", flags: withRuleCRD},
		{name: "dashboard", flags: []string{"--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=monitoring",
			"--set", "grafanaDashboard.annotations.grafana_folder=kvgate"}, configMap: true},
		{name: "rules", flags: append([]string{"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kps"}, withRuleCRD...), rules: true},
		// Like the ServiceMonitor: not where the Prometheus Operator is not.
		{name: "rules without the PrometheusRule CRD", flags: []string{"--set", "prometheusRule.enabled=true"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template", "kvgate", chartDir, "--namespace", "chart"}, c.flags...)
			out, err := helmCmd(t, helm, args...).Output()
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs := decodeYAML(t, "helm template", out)
			var cms []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" && o.GetName() == "kvgate-grafana-dashboard" {
					cms = append(cms, o)
				}
			}
			if got := len(cms) == 1; got != c.configMap {
				t.Fatalf("dashboard ConfigMaps rendered: %d, want one: %v", len(cms), c.configMap)
			}
			if c.configMap {
				var cm corev1.ConfigMap
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cms[0].Object, &cm); err != nil {
					t.Fatal(err)
				}
				if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "monitoring" || cm.Annotations["grafana_folder"] != "kvgate" {
					t.Errorf("ConfigMap labels %v, namespace %q, annotations %v; want grafana_dashboard: \"1\" in monitoring, folder kvgate", cm.Labels, cm.Namespace, cm.Annotations)
				}
				if got := cm.Data["kvgate.json"]; got != strings.TrimRight(string(dashboard), "\n") {
					t.Errorf("the ConfigMap's kvgate.json (%d bytes) is not deploy/grafana/kvgate.json (%d bytes)", len(got), len(dashboard))
				}
			}
			got := slices.Contains(kinds(objs), "PrometheusRule")
			if got != c.rules {
				t.Fatalf("PrometheusRule rendered: %v, want %v", got, c.rules)
			}
			if c.rules {
				pr := one(t, objs, "PrometheusRule", nil)
				if pr.GetLabels()["release"] != "kps" {
					t.Errorf("PrometheusRule labels %v lack release: kps", pr.GetLabels())
				}
				spec, _, _ := unstructured.NestedMap(pr.Object, "spec")
				want, _ := json.Marshal(rules)
				have, _ := json.Marshal(spec)
				if !bytes.Equal(want, have) {
					t.Errorf("the PrometheusRule's spec is not deploy/prometheus/kvgate-rules.yaml:\n%s\nwant\n%s", have, want)
				}
			}
		})
	}
}
