package extproc

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/kube"
)

// envoyBootstrap loads deploy/envoy/envoy.yaml as Envoy would: every field and every
// typed_config must be known (the packages imported above register the types), and the
// generated validation must pass.
func envoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, bs); err != nil {
		t.Fatalf("envoy.yaml is not a valid Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails validation: %v", err)
	}
	return bs
}

func TestEnvoyBootstrapManifest(t *testing.T) {
	bs := envoyBootstrap(t)
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}

	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 || len(listeners[0].GetFilterChains()) != 1 || len(listeners[0].GetFilterChains()[0].GetFilters()) != 1 {
		t.Fatalf("want one listener with one filter chain of one filter, got %v", listeners)
	}
	if got := listeners[0].GetAddress().GetSocketAddress().GetPortValue(); got != 8081 {
		t.Errorf("listener port %d, want 8081", got)
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatalf("the listener's filter is not an HTTP connection manager: %v", err)
	}

	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	if want := []string{"envoy.filters.http.ext_proc", "envoy.filters.http.router"}; !slices.Equal(names, want) {
		t.Fatalf("http filters %v, want %v", names, want)
	}
	ep := &filterv3.ExternalProcessor{}
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatalf("first filter is not ext_proc: %v", err)
	}
	if err := hcm.GetHttpFilters()[1].GetTypedConfig().UnmarshalTo(&routerv3.Router{}); err != nil {
		t.Fatalf("last filter is not the router: %v", err)
	}

	t.Run("processing mode", func(t *testing.T) {
		pm := ep.GetProcessingMode()
		for _, c := range []struct {
			name      string
			got, want any
		}{
			{"request_header_mode", pm.GetRequestHeaderMode(), filterv3.ProcessingMode_SEND},
			{"response_header_mode", pm.GetResponseHeaderMode(), filterv3.ProcessingMode_SEND},
			{"request_body_mode", pm.GetRequestBodyMode(), filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			{"response_body_mode", pm.GetResponseBodyMode(), filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
			// Envoy refuses FULL_DUPLEX_STREAMED without them.
			{"request_trailer_mode", pm.GetRequestTrailerMode(), filterv3.ProcessingMode_SEND},
			{"response_trailer_mode", pm.GetResponseTrailerMode(), filterv3.ProcessingMode_SEND},
		} {
			if c.got != c.want {
				t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
			}
		}
	})

	t.Run("ext_proc filter", func(t *testing.T) {
		if ep.GetFailureModeAllow() {
			t.Error("failure_mode_allow is true: the example is FailClose")
		}
		if ep.GetAllowModeOverride() {
			t.Error("allow_mode_override is true")
		}
		if ep.GetMessageTimeout() == nil {
			t.Error("message_timeout is not set")
		}
		if got := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "kvgate-epp" {
			t.Errorf("grpc_service targets cluster %q, want kvgate-epp", got)
		}
		md := ep.GetMetadataOptions()
		if !slices.Contains(md.GetReceivingNamespaces().GetUntyped(), LBNamespace) {
			t.Errorf("receiving namespaces %v lack %s: Envoy would drop kvgate's metadata", md.GetReceivingNamespaces().GetUntyped(), LBNamespace)
		}
		if !slices.Contains(md.GetForwardingNamespaces().GetUntyped(), SubsetNamespace) {
			t.Errorf("forwarding namespaces %v lack %s", md.GetForwardingNamespaces().GetUntyped(), SubsetNamespace)
		}
	})

	t.Run("kvgate-epp cluster", func(t *testing.T) {
		c := clusters["kvgate-epp"]
		if c == nil {
			t.Fatal("no kvgate-epp cluster")
		}
		opts := &upstreamhttpv3.HttpProtocolOptions{}
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(opts); err != nil {
			t.Fatalf("no HTTP protocol options: %v", err)
		}
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Error("gRPC needs HTTP/2: explicit_http_config.http2_protocol_options is not set")
		}
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			t.Fatalf("want one endpoint, got %v", eps)
		}
		sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if sa.GetAddress() != "127.0.0.1" || sa.GetPortValue() != 9002 {
			t.Errorf("endpoint %s:%d, want 127.0.0.1:9002", sa.GetAddress(), sa.GetPortValue())
		}
		for _, hc := range c.GetHealthChecks() {
			if got, want := hc.GetGrpcHealthCheck().GetServiceName(), extprocv3.ExternalProcessor_ServiceDesc.ServiceName; got != want {
				t.Errorf("health check service %q, want %q", got, want)
			}
		}
	})

	t.Run("model-servers cluster", func(t *testing.T) {
		c := clusters["model-servers"]
		if c == nil {
			t.Fatal("no model-servers cluster")
		}
		if c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			t.Errorf("type %v, lb_policy %v; want ORIGINAL_DST, CLUSTER_PROVIDED", c.GetType(), c.GetLbPolicy())
		}
		od := c.GetOriginalDstLbConfig()
		if !od.GetUseHttpHeader() || od.GetHttpHeaderName() != DestinationHeader {
			t.Errorf("original_dst_lb_config %v, want the header %s", od, DestinationHeader)
		}
	})

	t.Run("route", func(t *testing.T) {
		vhs := hcm.GetRouteConfig().GetVirtualHosts()
		if len(vhs) != 1 {
			t.Fatalf("want one virtual host, got %d", len(vhs))
		}
		for _, r := range vhs[0].GetRoutes() {
			if got := r.GetRoute().GetCluster(); got != "model-servers" {
				t.Errorf("route %v goes to %q, want model-servers", r.GetMatch(), got)
			}
		}
	})
}

// manifest is one YAML document of the Kubernetes examples.
type manifest struct {
	file string
	raw  []byte
	obj  map[string]any
}

func (m manifest) kind() string { s, _ := m.obj["kind"].(string); return s }

func (m manifest) name() string { return yamlStr(m.obj, "metadata", "name") }

// yamlStr, yamlNum and yamlList walk a decoded document; a missing step gives the zero value.
func yamlStr(v any, path ...string) string { s, _ := yamlWalk(v, path...).(string); return s }

func yamlNum(v any, path ...string) int { f, _ := yamlWalk(v, path...).(float64); return int(f) }

func yamlList(v any, path ...string) []any { l, _ := yamlWalk(v, path...).([]any); return l }

func yamlWalk(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// splitDocuments splits a multi-document YAML file at its "---" lines.
func splitDocuments(raw []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(cur.Bytes())) > 0 {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for line := range strings.Lines(string(raw)) {
		if strings.TrimRight(line, "\r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

func loadManifests(t *testing.T, dirs ...string) []manifest {
	t.Helper()
	var out []manifest
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join("../../deploy", dir, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no manifests in deploy/%s (%v)", dir, err)
		}
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, doc := range splitDocuments(raw) {
				m := manifest{file: filepath.Join(dir, filepath.Base(f)), raw: doc}
				if err := yaml.Unmarshal(doc, &m.obj); err != nil {
					t.Fatalf("%s: %v", m.file, err)
				}
				if m.kind() == "" || m.name() == "" {
					t.Fatalf("%s: a document without kind or name", m.file)
				}
				out = append(out, m)
			}
		}
	}
	return out
}

// decodeStrict decodes a document into a Kubernetes type, refusing unknown fields.
func decodeStrict[T any](t *testing.T, m manifest) *T {
	t.Helper()
	v := new(T)
	if err := yaml.UnmarshalStrict(m.raw, v); err != nil {
		t.Fatalf("%s: %s %s: %v", m.file, m.kind(), m.name(), err)
	}
	return v
}

func findManifest(t *testing.T, ms []manifest, kind, name string) manifest {
	t.Helper()
	for _, m := range ms {
		if m.kind() == kind && m.name() == name {
			return m
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return manifest{}
}

// argValue returns the value after flag in args.
func argValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// checkPicker checks a kvgate epp Deployment and its Service: the listeners in its
// arguments, its container and Service ports and its gRPC health probes agree.
func checkPicker(t *testing.T, ms []manifest, name string, listen, health int) (*appsv1.Deployment, *corev1.Service) {
	t.Helper()
	d := decodeStrict[appsv1.Deployment](t, findManifest(t, ms, "Deployment", name))
	svc := decodeStrict[corev1.Service](t, findManifest(t, ms, "Service", name))
	if d.Spec.Template.Spec.ServiceAccountName != name {
		t.Errorf("%s runs as %q", name, d.Spec.Template.Spec.ServiceAccountName)
	}
	decodeStrict[corev1.ServiceAccount](t, findManifest(t, ms, "ServiceAccount", name))
	rb := decodeStrict[rbacv1.RoleBinding](t, findManifest(t, ms, "RoleBinding", name))
	if rb.RoleRef.Name != name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != name {
		t.Errorf("RoleBinding %s binds %v to %v", name, rb.Subjects, rb.RoleRef)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Args[0] != "epp" {
		t.Errorf("%s runs %q, want epp", name, c.Args[0])
	}
	if got := argValue(c.Args, "--listen"); got != ":"+strconv.Itoa(listen) {
		t.Errorf("%s --listen %q, want :%d", name, got, listen)
	}
	if got := argValue(c.Args, "--health-listen"); got != ":"+strconv.Itoa(health) {
		t.Errorf("%s --health-listen %q, want :%d", name, got, health)
	}
	if got := argValue(c.Args, "--admin-listen"); got != ":9090" {
		t.Errorf("%s --admin-listen %q, want :9090", name, got)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc-ext-proc"] != int32(listen) || ports["grpc-health"] != int32(health) || ports["admin"] != 9090 {
		t.Errorf("%s container ports %v", name, ports)
	}
	for _, p := range svc.Spec.Ports {
		if ports[p.TargetPort.String()] != p.Port {
			t.Errorf("Service %s port %d targets %s (container port %d): the gateway dials the Service port",
				name, p.Port, p.TargetPort.String(), ports[p.TargetPort.String()])
		}
	}
	for _, p := range []struct {
		probe   *corev1.Probe
		service string
	}{{c.ReadinessProbe, HealthReadiness}, {c.LivenessProbe, HealthLiveness}} {
		if p.probe == nil || p.probe.GRPC == nil || p.probe.GRPC.Port != int32(health) || p.probe.GRPC.Service == nil || *p.probe.GRPC.Service != p.service {
			t.Errorf("%s: want a gRPC probe on %d for service %q, got %+v", name, health, p.service, p.probe)
		}
	}
	if svc.Spec.Selector["app.kubernetes.io/name"] != d.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Errorf("Service %s selects %v, pods are labelled %v", name, svc.Spec.Selector, d.Spec.Template.Labels)
	}
	return d, svc
}

func hasServicePort(svc *corev1.Service, port int) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return int(p.Port) == port })
}

func TestKubernetesManifests(t *testing.T) {
	eg := loadManifests(t, "envoy-gateway")
	bbr := loadManifests(t, "envoy-gateway/bbr")
	istio := loadManifests(t, "istio")

	pool := findManifest(t, eg, "InferencePool", "kvgate-pool")
	t.Run("picker", func(t *testing.T) {
		d, svc := checkPicker(t, eg, "kvgate-epp", 9002, 9003)
		decodeStrict[policyv1.PodDisruptionBudget](t, findManifest(t, eg, "PodDisruptionBudget", "kvgate-epp"))
		args := d.Spec.Template.Spec.Containers[0].Args
		if got := argValue(args, "--fallbacks"); got != "" && got != "0" {
			t.Errorf("--fallbacks %q: a gateway with an ORIGINAL_DST cluster reads one address", got)
		}
		if !slices.Contains(args, "--secure-serving") {
			t.Errorf("args %v: Envoy Gateway dials the picker over TLS; --secure-serving is needed", args)
		}
		ns, name, _ := strings.Cut(argValue(args, "--igwc"), "/")
		if ns != "$(POD_NAMESPACE)" {
			t.Errorf("--igwc namespace %q", ns)
		}
		cfg := decodeStrict[v1alpha1.InferenceGatewayConfig](t, findManifest(t, eg, v1alpha1.Kind, name))
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Errorf("InferenceGatewayConfig %s: %v", name, errs)
		}
		if got := cfg.Spec.Schedulers[0].PoolRef; got != pool.name() {
			t.Errorf("poolRef %q, want the InferencePool %s", got, pool.name())
		}
		role := decodeStrict[rbacv1.Role](t, findManifest(t, eg, "Role", "kvgate-epp"))
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "inferencepools") }) {
			t.Error("the picker's Role cannot read InferencePools")
		}

		ref := yamlWalk(pool.obj, "spec", "endpointPickerRef")
		if yamlStr(ref, "kind") != "Service" || yamlStr(ref, "name") != svc.Name || !hasServicePort(svc, yamlNum(ref, "port", "number")) {
			t.Errorf("endpointPickerRef %v does not name the Service %s and its ext_proc port", ref, svc.Name)
		}
		if yamlNum(ref, "port", "number") != 9002 {
			t.Errorf("endpointPickerRef port %d, want 9002", yamlNum(ref, "port", "number"))
		}
		if fm := yamlStr(ref, "failureMode"); fm != "FailClose" && fm != "FailOpen" {
			t.Errorf("failureMode %q", fm)
		}
		if got := yamlList(pool.obj, "spec", "targetPorts"); len(got) != 1 || yamlNum(got[0], "number") != 8000 {
			t.Errorf("targetPorts %v, want [{number: 8000}]", got)
		}
		if sel := yamlWalk(pool.obj, "spec", "selector", "matchLabels"); sel == nil || len(sel.(map[string]any)) == 0 {
			t.Error("the InferencePool selects no labels")
		}
	})

	for _, c := range []struct {
		name  string
		ms    []manifest
		class string
	}{{"envoy-gateway", eg, "envoy-gateway"}, {"istio", istio, "istio"}} {
		t.Run("route "+c.name, func(t *testing.T) {
			gw := findManifest(t, c.ms, "Gateway", "inference-gateway")
			if got := yamlStr(gw.obj, "spec", "gatewayClassName"); got != c.class {
				t.Errorf("gatewayClassName %q, want %q", got, c.class)
			}
			route := findManifest(t, c.ms, "HTTPRoute", "llm")
			parents := yamlList(route.obj, "spec", "parentRefs")
			if len(parents) != 1 || yamlStr(parents[0], "name") != gw.name() {
				t.Errorf("HTTPRoute parents %v, want the Gateway %s", parents, gw.name())
			}
			for _, rule := range yamlList(route.obj, "spec", "rules") {
				for _, b := range yamlList(rule, "backendRefs") {
					if yamlStr(b, "group") != "inference.networking.k8s.io" || yamlStr(b, "kind") != "InferencePool" || yamlStr(b, "name") != pool.name() {
						t.Errorf("backendRef %v, want the InferencePool %s", b, pool.name())
					}
				}
			}
		})
	}

	t.Run("body-based router", func(t *testing.T) {
		d, svc := checkPicker(t, bbr, "kvgate-bbr", 9004, 9005)
		args := d.Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, "--bbr") || argValue(args, "--bbr-configmaps") == "" {
			t.Errorf("router args %v lack --bbr or --bbr-configmaps", args)
		}
		role := decodeStrict[rbacv1.Role](t, findManifest(t, bbr, "Role", "kvgate-bbr"))
		if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, "configmaps") && slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") && slices.Contains(r.Verbs, "get")
		}) {
			t.Errorf("the router's Role cannot get, list and watch ConfigMaps: %v", role.Rules)
		}

		pol := findManifest(t, bbr, "EnvoyExtensionPolicy", "kvgate-bbr")
		targets := yamlList(pol.obj, "spec", "targetRefs")
		if len(targets) != 1 || yamlStr(targets[0], "kind") != "Gateway" || yamlStr(targets[0], "name") != "inference-gateway" {
			t.Errorf("targetRefs %v, want the Gateway inference-gateway", targets)
		}
		procs := yamlList(pol.obj, "spec", "extProc")
		if len(procs) != 1 {
			t.Fatalf("want one extProc, got %v", procs)
		}
		refs := yamlList(procs[0], "backendRefs")
		if len(refs) != 1 || yamlStr(refs[0], "name") != svc.Name || !hasServicePort(svc, yamlNum(refs[0], "port")) || yamlNum(refs[0], "port") != 9004 {
			t.Errorf("extProc backendRefs %v, want %s:9004", refs, svc.Name)
		}
		if got := yamlStr(procs[0], "processingMode", "request", "body"); got != "FullDuplexStreamed" {
			t.Errorf("request body mode %q, want FullDuplexStreamed", got)
		}
		if open, _ := yamlWalk(procs[0], "failOpen").(bool); open {
			t.Error("failOpen with FullDuplexStreamed: Envoy Gateway refuses it")
		}

		cm := decodeStrict[corev1.ConfigMap](t, findManifest(t, bbr, "ConfigMap", "llama-8b-adapters"))
		if cm.Labels[kube.BBRManagedLabel] != "true" {
			t.Errorf("ConfigMap labels %v lack %s=true", cm.Labels, kube.BBRManagedLabel)
		}
		adapters, err := kube.ParseAdapterConfigMap(cm)
		if err != nil || len(adapters) < 2 {
			t.Errorf("the ConfigMap maps %v (%v)", adapters, err)
		}
		for a, base := range adapters {
			if base != cm.Data["baseModel"] {
				t.Errorf("adapter %s maps to %s", a, base)
			}
		}
	})

	t.Run("documents", func(t *testing.T) {
		// Every document decodes as its kind where the type is at hand; the rest were
		// parsed above.
		for _, m := range slices.Concat(eg, bbr, istio) {
			switch m.kind() {
			case "Deployment":
				decodeStrict[appsv1.Deployment](t, m)
			case "Service":
				decodeStrict[corev1.Service](t, m)
			case "ServiceAccount":
				decodeStrict[corev1.ServiceAccount](t, m)
			case "ConfigMap":
				decodeStrict[corev1.ConfigMap](t, m)
			case "Role":
				decodeStrict[rbacv1.Role](t, m)
			case "RoleBinding":
				decodeStrict[rbacv1.RoleBinding](t, m)
			case "PodDisruptionBudget":
				decodeStrict[policyv1.PodDisruptionBudget](t, m)
			case v1alpha1.Kind:
				decodeStrict[v1alpha1.InferenceGatewayConfig](t, m)
			case "InferencePool", "Gateway", "GatewayClass", "HTTPRoute", "EnvoyExtensionPolicy":
			default:
				t.Errorf("%s: unexpected kind %s", m.file, m.kind())
			}
		}
	})
}
