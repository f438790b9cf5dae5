// Package v1 holds kvgate's own Go types of the InferencePool API
// (inference.networking.k8s.io/v1) that the Gateway API Inference Extension
// defines. kvgate reads InferencePools through these types, and its manifests
// can install the CRD generated from them on clusters that have no InferencePool
// CRD yet. The types are wire-compatible with the upstream v1 API: the same
// fields, defaults and validation rules, so a document valid under the upstream
// CRD is valid under this one and decodes to the same fields, and a cluster may
// carry either CRD. (One check is looser here: the upstream CRD also checks the
// syntax of selector label values; a value no pod can carry matches no pod.)
//
// Written for kvgate, not vendored: kvgate does not depend on the upstream
// module, whose controller and client code it does not use.
//
// +kubebuilder:object:generate=true
// +groupName=inference.networking.k8s.io
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Group, version and kind of the resource.
const (
	Group    = "inference.networking.k8s.io"
	Version  = "v1"
	Kind     = "InferencePool"
	ListKind = "InferencePoolList"
	// Resource is the plural name the API server serves the kind under.
	Resource = "inferencepools"
)

// APIVersion is the apiVersion field InferencePool documents carry.
const APIVersion = Group + "/" + Version

// InferencePool is a set of model-server pods, picked by label in one
// namespace, that serve one model behind a gateway: each of its target ports on
// each pod is one endpoint. kvgate reads InferencePools through this type (a
// scheduler's poolRef names one) and can install the CRD generated from it for
// clusters that have none; it is wire-compatible with the upstream v1 type, so
// kvgate works with either CRD installed.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=infpool
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"
type InferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state: which pods, which ports, which protocol and
	// which endpoint picker.
	// +required
	Spec InferencePoolSpec `json:"spec"`

	// Status is what the gateways (parents) that use the pool report about it.
	// +optional
	Status InferencePoolStatus `json:"status,omitempty"`
}

// InferencePoolList is a list of InferencePools, as the API server returns it;
// kvgate lists pools through it like any other kind.
//
// +kubebuilder:object:root=true
type InferencePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferencePool `json:"items"`
}

// InferencePoolSpec is the desired state of an InferencePool, the part of it
// kvgate turns into endpoints.
type InferencePoolSpec struct {
	// Selector picks the pool's pods by label, in the pool's own namespace only.
	// +required
	Selector LabelSelector `json:"selector"`

	// TargetPorts are the ports the model servers listen on. Every port of every
	// selected pod is a distinct endpoint, podIP:port (for example one per
	// data-parallel rank of one pod).
	//
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(p1, self.exists_one(p2, p1.number==p2.number))",message="port number must be unique"
	// +listType=atomic
	TargetPorts []Port `json:"targetPorts,omitempty"`

	// AppProtocol is the application protocol of all the target ports: "http"
	// (HTTP/1.1, the default) or "kubernetes.io/h2c" (HTTP/2 without TLS).
	//
	// +optional
	// +kubebuilder:default=http
	AppProtocol AppProtocol `json:"appProtocol,omitempty"`

	// EndpointPickerRef names the endpoint picker (EPP) a gateway asks which
	// endpoint serves each request. kvgate picks endpoints itself; it keeps the
	// field so that pools written for other gateways read and round-trip intact.
	//
	// +optional
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// Ports returns the pool's target port numbers, in the order the spec lists
// them.
func (s InferencePoolSpec) Ports() []int32 {
	ports := make([]int32, 0, len(s.TargetPorts))
	for _, p := range s.TargetPorts {
		ports = append(ports, p.Number)
	}
	return ports
}

// LabelSelector is the equality-only selector InferencePools use: every label
// in MatchLabels must be on a pod for it to be in the pool. It has the shape of
// a Service's selector, so a pool maps onto a Service one to one.
type LabelSelector struct {
	// MatchLabels are the labels, all of which a pod must carry.
	//
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// Port is one network port: a target port of the pool's pods, or the port of
// the endpoint picker's Service.
type Port struct {
	// Number is the port number, 1 to 65535.
	//
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Number int32 `json:"number,omitempty"`
}

// AppProtocol is the application protocol a pool's model servers speak.
//
// +kubebuilder:validation:Enum=http;"kubernetes.io/h2c"
type AppProtocol string

// The application protocols an InferencePool may name.
const (
	// AppProtocolHTTP is HTTP/1.1, the default.
	AppProtocolHTTP AppProtocol = "http"
	// AppProtocolH2C is HTTP/2 over cleartext (prior knowledge, no TLS).
	AppProtocolH2C AppProtocol = "kubernetes.io/h2c"
)

// EndpointPickerRef points at the endpoint picker extension of a pool: by
// default a Service in the pool's namespace, whose port must then be given.
//
// +kubebuilder:validation:XValidation:rule="self.kind != 'Service' || has(self.port)",message="port is required when kind is 'Service' or unspecified (defaults to 'Service')"
type EndpointPickerRef struct {
	// Group is the API group of the referent; "" (the default) is the core group.
	//
	// +optional
	// +kubebuilder:default=""
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Group *string `json:"group,omitempty"`

	// Kind is the kind of the referent, Service by default. An ExternalName
	// Service must not be used.
	//
	// +optional
	// +kubebuilder:default=Service
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind,omitempty"`

	// Name is the name of the referent, in the pool's namespace.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// Port is the port of the endpoint picker: for a Service, the Service's port
	// (not its target port). Required when the kind is Service.
	//
	// +optional
	Port *Port `json:"port,omitempty"`

	// FailureMode is what a gateway does when the endpoint picker does not
	// answer: FailClose (the default) refuses the request, FailOpen sends it to
	// an endpoint of the gateway's own choosing.
	//
	// +optional
	// +kubebuilder:default=FailClose
	FailureMode FailureMode `json:"failureMode,omitempty"`
}

// FailureMode is how a gateway handles an endpoint picker that does not answer.
//
// +kubebuilder:validation:Enum=FailOpen;FailClose
type FailureMode string

// The failure modes an EndpointPickerRef may name.
const (
	// FailOpen sends the request on to an endpoint the gateway picks itself.
	FailOpen FailureMode = "FailOpen"
	// FailClose refuses the request; the default.
	FailClose FailureMode = "FailClose"
)

// InferencePoolStatus is what the parents (gateways) using a pool report about it.
type InferencePoolStatus struct {
	// Parents has one entry per parent that uses the pool, at most 32; an empty
	// list means no parent has taken the pool up.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Parents []ParentStatus `json:"parents,omitempty"`
}

// ParentStatus is the pool's status as one parent (a Gateway, usually) sees it.
type ParentStatus struct {
	// Conditions are the parent's conditions on the pool, at most one of each
	// type: Accepted and ResolvedRefs (see the condition constants).
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ParentRef names the parent this entry is for.
	//
	// +required
	ParentRef ParentReference `json:"parentRef"`

	// ControllerName names the controller that wrote the entry, as
	// DOMAIN/PATH (a GatewayClass's controllerName when the parent is a Gateway).
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$`
	ControllerName string `json:"controllerName,omitempty"`
}

// ParentReference names the parent of a status entry: a Gateway of the Gateway
// API unless the group and kind say otherwise.
type ParentReference struct {
	// Group is the parent's API group, gateway.networking.k8s.io by default.
	//
	// +optional
	// +kubebuilder:default="gateway.networking.k8s.io"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Group *string `json:"group,omitempty"`

	// Kind is the parent's kind, Gateway by default.
	//
	// +optional
	// +kubebuilder:default=Gateway
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind,omitempty"`

	// Name is the parent's name.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// Namespace is the parent's namespace; the pool's own when empty.
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
}

// Condition types and reasons of ParentStatus.Conditions.
const (
	// ConditionAccepted says whether the parent accepted the pool as a backend.
	ConditionAccepted = "Accepted"
	// ConditionResolvedRefs says whether the parent resolved the pool's
	// references (its endpoint picker).
	ConditionResolvedRefs = "ResolvedRefs"

	// ReasonAccepted goes with Accepted=True.
	ReasonAccepted = "Accepted"
	// ReasonNotSupportedByParent goes with Accepted=False: the parent does not
	// take InferencePools as backends.
	ReasonNotSupportedByParent = "NotSupportedByParent"
	// ReasonHTTPRouteNotAccepted goes with Accepted=False: the route referring
	// to the pool was refused.
	ReasonHTTPRouteNotAccepted = "HTTPRouteNotAccepted"
	// ReasonPending goes with Accepted=Unknown.
	ReasonPending = "Pending"
	// ReasonResolvedRefs goes with ResolvedRefs=True.
	ReasonResolvedRefs = "ResolvedRefs"
	// ReasonInvalidExtensionRef goes with ResolvedRefs=False: the endpoint
	// picker reference is of an unsupported kind or names nothing.
	ReasonInvalidExtensionRef = "InvalidExtensionRef"
)
