package v1

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// pool is an InferencePool as a cluster running the upstream CRD returns it:
// every spec field set, defaults filled in, and status from two parents.
const pool = `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: llama-pool
  namespace: models
  resourceVersion: "4711"
  generation: 3
  labels: {team: serving}
spec:
  selector:
    matchLabels:
      app: vllm-llama
      kvgate.io/model: llama-3.1-8b
  targetPorts:
    - number: 8000
    - number: 8001
    - number: 8002
  appProtocol: kubernetes.io/h2c
  endpointPickerRef:
    group: ""
    kind: Service
    name: llama-epp
    port: {number: 9002}
    failureMode: FailOpen
status:
  parents:
    - parentRef:
        group: gateway.networking.k8s.io
        kind: Gateway
        name: inference-gateway
        namespace: gateways
      controllerName: gateway.envoyproxy.io/gatewayclass-controller
      conditions:
        - type: Accepted
          status: "True"
          reason: Accepted
          message: accepted by the parent
          observedGeneration: 3
          lastTransitionTime: "2026-05-01T10:00:00Z"
        - type: ResolvedRefs
          status: "False"
          reason: InvalidExtensionRef
          message: service llama-epp not found
          observedGeneration: 3
          lastTransitionTime: "2026-05-01T10:00:01Z"
    - parentRef: {name: other-gateway}
      conditions: []
`

// TestRoundTrip: an upstream-shaped document decodes into the types with every
// field in place, and encodes back to the same document.
func TestRoundTrip(t *testing.T) {
	var p InferencePool
	if err := yaml.UnmarshalStrict([]byte(pool), &p); err != nil {
		t.Fatalf("decoding: %v", err)
	}
	s := p.Spec
	if p.APIVersion != APIVersion || p.Kind != Kind || p.Name != "llama-pool" || p.Namespace != "models" || p.Generation != 3 {
		t.Errorf("type and object meta: %+v %+v", p.TypeMeta, p.ObjectMeta)
	}
	if want := map[string]string{"app": "vllm-llama", "kvgate.io/model": "llama-3.1-8b"}; !reflect.DeepEqual(s.Selector.MatchLabels, want) {
		t.Errorf("selector %v, want %v", s.Selector.MatchLabels, want)
	}
	if got := s.Ports(); !slices.Equal(got, []int32{8000, 8001, 8002}) {
		t.Errorf("Ports() = %v", got)
	}
	if s.AppProtocol != AppProtocolH2C {
		t.Errorf("appProtocol %q", s.AppProtocol)
	}
	e := s.EndpointPickerRef
	if e == nil || e.Group == nil || *e.Group != "" || e.Kind != "Service" || e.Name != "llama-epp" ||
		e.Port == nil || e.Port.Number != 9002 || e.FailureMode != FailOpen {
		t.Errorf("endpointPickerRef %+v", e)
	}
	if len(p.Status.Parents) != 2 {
		t.Fatalf("parents: %+v", p.Status.Parents)
	}
	ps := p.Status.Parents[0]
	if ps.ParentRef.Group == nil || *ps.ParentRef.Group != "gateway.networking.k8s.io" || ps.ParentRef.Kind != "Gateway" ||
		ps.ParentRef.Name != "inference-gateway" || ps.ParentRef.Namespace != "gateways" ||
		ps.ControllerName != "gateway.envoyproxy.io/gatewayclass-controller" {
		t.Errorf("parent 0: %+v", ps)
	}
	if len(ps.Conditions) != 2 || ps.Conditions[1].Type != ConditionResolvedRefs || ps.Conditions[1].Status != metav1.ConditionFalse ||
		ps.Conditions[1].Reason != ReasonInvalidExtensionRef || ps.Conditions[1].ObservedGeneration != 3 ||
		ps.Conditions[1].LastTransitionTime.Unix() != 1777629601 {
		t.Errorf("parent 0 conditions: %+v", ps.Conditions)
	}
	if p1 := p.Status.Parents[1]; p1.ParentRef.Name != "other-gateway" || p1.ParentRef.Group != nil || p1.ParentRef.Kind != "" {
		t.Errorf("parent 1: %+v", p1)
	}

	// Encoded again, the document is the same, field for field (an empty list
	// the encoder leaves out aside).
	out, err := json.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	var want, got map[string]any
	if err := yaml.Unmarshal([]byte(pool), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	delete(want["status"].(map[string]any)["parents"].([]any)[1].(map[string]any), "conditions")
	if !reflect.DeepEqual(got, want) {
		a, _ := yaml.Marshal(want)
		b, _ := yaml.Marshal(got)
		t.Errorf("re-encoded document differs\nwant:\n%s\ngot:\n%s", a, b)
	}

	// A deep copy shares nothing with the original.
	c := p.DeepCopy()
	c.Spec.Selector.MatchLabels["app"] = "changed"
	c.Spec.TargetPorts[0].Number = 1
	*c.Spec.EndpointPickerRef.Group = "changed"
	c.Status.Parents[0].Conditions[0].Reason = "changed"
	if p.Spec.Selector.MatchLabels["app"] != "vllm-llama" || p.Spec.TargetPorts[0].Number != 8000 ||
		*p.Spec.EndpointPickerRef.Group != "" || p.Status.Parents[0].Conditions[0].Reason != ReasonAccepted {
		t.Error("DeepCopy shares memory with the original")
	}
}

// TestScheme: AddToScheme registers both kinds under inference.networking.k8s.io/v1.
func TestScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for obj, kind := range map[runtime.Object]string{&InferencePool{}: Kind, &InferencePoolList{}: ListKind} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0] != SchemeGroupVersion.WithKind(kind) {
			t.Errorf("%T: %v %v", obj, gvks, err)
		}
	}
}
