// Package v1alpha1 holds the InferenceGatewayConfig API: the resource a Kubernetes
// user applies and the file `kvgate serve --config` reads are the same document.
//
// Every CEL rule on a duration passes when the value did not change
// (optionalOldSelf): duration() raises an error on a string it cannot parse,
// and the API server ratchets failed rules on unchanged fields but not errors,
// so a value stored under an older CRD would otherwise make every update of
// the object refused, its status included. Durations are at most 64
// characters, which keeps the comparison within the API server's CEL cost
// budget.
//
// +kubebuilder:object:generate=true
// +groupName=gateway.kvgate.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Group, version and kind of the resource.
const (
	Group   = "gateway.kvgate.io"
	Version = "v1alpha1"
	Kind    = "InferenceGatewayConfig"
)

// APIVersion is the apiVersion field documents must carry.
const APIVersion = Group + "/" + Version

// InferenceGatewayConfig configures one kvgate gateway: its model pools
// (schedulers), how requests are routed to them, and how each pool picks a pod.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=igwc
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Schedulers",type=integer,JSONPath=`.status.servedSchedulers`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.readyEndpoints`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InferenceGatewayConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceGatewayConfigSpec   `json:"spec"`
	Status InferenceGatewayConfigStatus `json:"status,omitempty"`
}

// InferenceGatewayConfigList is a list of InferenceGatewayConfig.
//
// +kubebuilder:object:root=true
type InferenceGatewayConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceGatewayConfig `json:"items"`
}

// InferenceGatewayConfigSpec is the desired configuration.
//
// +kubebuilder:validation:XValidation:rule="size(self.schedulers) <= 1 || (has(self.bbr) && self.bbr.enabled)",message="bbr.enabled must be true when there is more than one scheduler: the model in the body picks the pool"
// +kubebuilder:validation:XValidation:rule="self.schedulers.all(s, self.schedulers.exists_one(t, t.modelName == s.modelName))",message="modelName must be unique across schedulers"
// +kubebuilder:validation:XValidation:rule="self.schedulers.all(s, !has(s.loraAdapters) || s.loraAdapters.all(a, !(a in self.schedulers.map(t, t.modelName))))",message="a loraAdapters entry must not be the modelName of a scheduler",fieldPath=".schedulers"
// +kubebuilder:validation:XValidation:rule="has(self.auth) || self.schedulers.all(s, !has(s.allowedTenants) || size(s.allowedTenants) == 0)",message="allowedTenants needs spec.auth: without it no request has a tenant",fieldPath=".schedulers"
type InferenceGatewayConfigSpec struct {
	// BBR is the body-based router that reads the model from the request body.
	// +optional
	BBR BBRSpec `json:"bbr,omitempty"`

	// Schedulers are the model pools, one per served model.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	// +listType=map
	// +listMapKey=name
	Schedulers []SchedulerSpec `json:"schedulers"`

	// Gateway tunes kvgate's data plane; every field has a default.
	// +optional
	Gateway GatewaySpec `json:"gateway,omitempty"`

	// Objectives name classes of requests, as a client names them in the
	// x-gateway-inference-objective header (the Gateway API Inference
	// Extension's InferenceObjective), and give each a priority. A request
	// without the header, or naming an objective not listed, has priority 0.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +listType=map
	// +listMapKey=name
	Objectives []ObjectiveSpec `json:"objectives,omitempty"`

	// Auth authenticates the clients of the OpenAI API (kvgate serve) or of
	// the Envoy route (kvgate epp) and names their tenant. Unset, anyone who
	// reaches the listener is served.
	// +optional
	Auth *AuthSpec `json:"auth,omitempty"`

	// TLS serves the OpenAI API over TLS (kvgate serve): TLS 1.2 or later,
	// HTTP/2 by ALPN, the certificate reloaded when it is rotated.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// AuthSpec is how clients prove who they are: API keys, JWTs, or both. A
// request whose credentials are refused gets 401 with WWW-Authenticate; one
// whose tenant a scheduler's allowedTenants leaves out gets 403. It is the
// spec.auth of both tiers: kvgate serve and epp here, and kvgate global's
// GlobalRouterConfig.
//
// +kubebuilder:validation:XValidation:rule="has(self.jwt) || (has(self.apiKeys) && size(self.apiKeys) > 0) || (has(self.allowAnonymous) && self.allowAnonymous)",message="no authentication configured: set apiKeys, jwt or allowAnonymous"
type AuthSpec struct {
	// JWT accepts bearer tokens signed by a key of a JWKS.
	// +optional
	JWT *JWTSpec `json:"jwt,omitempty"`
	// APIKeys are the accepted API keys (Authorization: Bearer <key>, or
	// api-key: <key>), stored as hashes only. Remove an entry to revoke it.
	// +kubebuilder:validation:MaxItems=10000
	// +optional
	APIKeys []APIKeySpec `json:"apiKeys,omitempty"`
	// AllowAnonymous serves requests that carry no credentials, as tenant
	// "" (wrong credentials are refused all the same).
	// +optional
	AllowAnonymous bool `json:"allowAnonymous,omitempty"`
}

// JWTSpec accepts JWTs signed by a key of the JWKS at jwksURI (RS*, PS*,
// ES*, EdDSA), with exp and nbf checked, and iss, aud and required claims
// when set. The keys are fetched again every refreshInterval and when a
// token names a key id not seen yet, so that a rotated key is accepted.
type JWTSpec struct {
	// Issuer, when set, must equal the token's iss claim.
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	Issuer string `json:"issuer,omitempty"`
	// JWKSURI is where the signing keys are fetched from (http or https).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	JWKSURI string `json:"jwksURI"`
	// Audiences, when set: the token's aud must name at least one of them.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +optional
	Audiences []string `json:"audiences,omitempty"`
	// RequiredClaims the token must carry, each with one of its values.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	RequiredClaims []ClaimRequirement `json:"requiredClaims,omitempty"`
	// TenantClaim names the claim holding the tenant (default sub); dots
	// reach into objects: org.id reads {"org":{"id":...}}.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	TenantClaim string `json:"tenantClaim,omitempty"`
	// RefreshInterval is how often the JWKS is fetched again (default 5m,
	// at least 1s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('1s'))",message="must be at least 1s",optionalOldSelf=true
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
	// Leeway is the clock skew allowed on exp and nbf (default 30s, at most
	// 5m: more would keep an expired token good far longer than its issuer
	// meant).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) <= duration('5m'))",message="must be between 0 and 5m0s",optionalOldSelf=true
	Leeway *metav1.Duration `json:"leeway,omitempty"`
	// FetchTimeout bounds one fetch of the JWKS (default 10s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) > duration('0s'))",message="must be positive",optionalOldSelf=true
	FetchTimeout *metav1.Duration `json:"fetchTimeout,omitempty"`
}

// ClaimRequirement is a claim a token must carry with one of Values: a string
// claim equal to one, a list holding one, or a space-separated string (as
// scope) holding one as a word.
type ClaimRequirement struct {
	// Name of the claim; dots reach into objects as in tenantClaim.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// Values accepted.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Values []string `json:"values"`
}

// APIKeySpec maps the hash of one API key to its tenant. Make the hash with
// printf %s "$KEY" | sha256sum (printf: echo adds a newline to the key).
type APIKeySpec struct {
	// Tenant the key belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Tenant string `json:"tenant"`
	// Hash is "sha256:" and the 64 hex digits of SHA-256 of the key.
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-fA-F]{64}$`
	Hash string `json:"hash"`
}

// TLSSpec is the API listener's certificate: a kubernetes.io/tls Secret (in
// Kubernetes) or PEM files (outside it, or a Secret mounted as files).
//
// +kubebuilder:validation:XValidation:rule="(has(self.secretName) && size(self.secretName) > 0) != (has(self.certFile) && size(self.certFile) > 0)",message="set secretName or certFile and keyFile, not both"
// +kubebuilder:validation:XValidation:rule="(has(self.certFile) && size(self.certFile) > 0) == (has(self.keyFile) && size(self.keyFile) > 0)",message="certFile and keyFile go together"
type TLSSpec struct {
	// SecretName is a kubernetes.io/tls Secret in the configuration's
	// namespace (tls.crt, tls.key), watched for rotation.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// CertFile is a PEM certificate chain, reread when it changes.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	CertFile string `json:"certFile,omitempty"`
	// KeyFile is the certificate's PEM private key.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	KeyFile string `json:"keyFile,omitempty"`
	// MinVersion is the oldest TLS version accepted: "1.2" (default) or "1.3".
	// +kubebuilder:validation:Enum="1.2";"1.3"
	// +optional
	MinVersion string `json:"minVersion,omitempty"`
}

// ObjectiveSpec is one class of requests and its priority.
type ObjectiveSpec struct {
	// Name is the value of the x-gateway-inference-objective header.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Priority orders the requests waiting for a free endpoint: a freed slot
	// goes to the highest priority waiting. Below 0 a request is sheddable:
	// when every endpoint of its pool is at its limit it is refused at once
	// (429) instead of waiting.
	// +optional
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority,omitempty"`

	// TTFTSLO is the time to first token the objective's requests should get;
	// it overrides the scheduler's (0s: none for them; unset: the
	// scheduler's). When no endpoint is predicted to meet it, a sheddable
	// request (priority below 0) is refused at once with 429, any other goes to
	// the best endpoint.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	TTFTSLO *metav1.Duration `json:"ttftSLO,omitempty"`
}

// BBRSpec configures body-based routing.
//
// +kubebuilder:validation:XValidation:rule="!has(self.replicas)",message="replicas is not supported: scale the kvgate Deployment instead (Helm value replicas)",fieldPath=".replicas"
type BBRSpec struct {
	// Enabled turns on routing by the body's model field; required when there is
	// more than one scheduler.
	// +optional
	Enabled bool `json:"enabled"`
	// Replicas is refused: the body-based router runs inside kvgate, so scale
	// the kvgate Deployment instead (Helm value replicas).
	//
	// Deprecated: kept only so that a document carrying it decodes and is
	// refused with that message rather than as an unknown field.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// MaxRequestBodyBytes bounds a request body (default 268435456, 256 MiB).
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=1073741824
	// +optional
	MaxRequestBodyBytes *int64 `json:"maxRequestBodyBytes,omitempty"`
}

// SchedulerSpec is one model pool and how it picks a pod. Its endpoints come
// from exactly one of modelSelector, poolRef and endpoints.
//
// +kubebuilder:validation:XValidation:rule="(has(self.modelSelector) ? 1 : 0) + (has(self.poolRef) && size(self.poolRef) > 0 ? 1 : 0) + (has(self.endpoints) && size(self.endpoints) > 0 ? 1 : 0) == 1",message="must take its endpoints from exactly one of modelSelector, poolRef (Kubernetes) or endpoints (static)"
// +kubebuilder:validation:XValidation:rule="!has(self.replicas)",message="replicas is not supported: scale the kvgate Deployment instead (Helm value replicas)",fieldPath=".replicas"
// +kubebuilder:validation:XValidation:rule="!has(self.backendTLS) || (has(self.appProtocol) && self.appProtocol == 'https')",message="applies only with appProtocol https",fieldPath=".backendTLS"
// +kubebuilder:validation:XValidation:rule="!has(self.metrics) || (has(self.engineType) && size(self.engineType) > 0)",message="needs an engineType: custom, or the built-in one whose map it overrides",fieldPath=".metrics"
// +kubebuilder:validation:XValidation:rule="!has(self.engineType) || self.engineType != 'custom' || (has(self.metrics) && (has(self.metrics.queue) || has(self.metrics.running) || has(self.metrics.kvUsage) || has(self.metrics.kvUsed)))",message="engineType custom needs metrics with at least one of queue, running and kvUsage (or kvUsed with kvTotal)",fieldPath=".metrics"
type SchedulerSpec struct {
	// Name identifies the scheduler in metrics, headers and logs.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`
	Name string `json:"name"`
	// ModelName is the model clients ask for; unique across schedulers.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ModelName string `json:"modelName"`
	// ModelSelector selects the model-server pods of the pool (in Kubernetes);
	// it must have matchLabels or matchExpressions: an empty one would select
	// every pod of the namespace.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="selects every pod: give it matchLabels or matchExpressions"
	// +optional
	ModelSelector *metav1.LabelSelector `json:"modelSelector,omitempty"`
	// Endpoints lists the pool's servers as host:port outside Kubernetes; the
	// host is a name, an IPv4 address or a bracketed IPv6 address, the port
	// between 1 and 65535.
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:Pattern=`^(\[[^\[\]]+\]|[^:\[\]]+):0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// PoolRef names an InferencePool (inference.networking.k8s.io/v1) in the same
	// namespace whose selector and target port define the pool, instead of
	// modelSelector and targetPort. Every port of its targetPorts is an
	// endpoint of each pod, and its appProtocol applies.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
	PoolRef string `json:"poolRef,omitempty"`
	// TargetPort is the model servers' port (default 8000). A pointer so that
	// an explicit 0 is refused rather than read as unset.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	TargetPort *int32 `json:"targetPort,omitempty"`
	// AppProtocol of the model servers: http (default), kubernetes.io/h2c
	// or https (TLS, checked against backendTLS or the system's CAs; metrics
	// are scraped over it too).
	// +kubebuilder:validation:Enum=http;kubernetes.io/h2c;https
	// +optional
	AppProtocol string `json:"appProtocol,omitempty"`
	// BackendTLS is how the model servers' certificates are checked when
	// appProtocol is https.
	// +optional
	BackendTLS *BackendTLSSpec `json:"backendTLS,omitempty"`
	// AllowedTenants, when set, are the only tenants (spec.auth) this pool
	// serves: another gets 403 and does not see its models in /v1/models.
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MinLength=1
	// +listType=set
	// +optional
	AllowedTenants []string `json:"allowedTenants,omitempty"`
	// EngineType selects the model servers' metric map: vllm, sglang, trtllm,
	// triton, tgi or llamacpp (built in), or custom (the map in metrics); empty
	// means detect a built-in one from the exposition.
	// +kubebuilder:validation:Enum=vllm;sglang;trtllm;triton;tgi;llamacpp;custom
	// +optional
	EngineType string `json:"engineType,omitempty"`
	// Metrics says where the model servers publish each signal kvgate scores
	// on. Required with engineType custom; with a built-in engineType, the
	// signals it sets replace the built-in map's.
	// +optional
	Metrics *MetricMap `json:"metrics,omitempty"`
	// Picker chooses how a pod is picked: kvgate (GPU-aware, the default) or a
	// baseline for comparison: least-request, round-robin, random, power-of-two.
	// +kubebuilder:validation:Enum=kvgate;least-request;round-robin;random;power-of-two
	// +optional
	Picker string `json:"picker,omitempty"`
	// Profile names built-in weights: kvgate (the default), chat, batch or
	// gie-default; llm-d-sticky and dynamo-kv reproduce llm-d's and Dynamo's
	// default routing, for comparison.
	// +kubebuilder:validation:Enum=kvgate;chat;batch;gie-default;llm-d-sticky;dynamo-kv
	// +optional
	Profile string `json:"profile,omitempty"`
	// Weights of the scorers; set fields override the profile's.
	// +optional
	Weights *Weights `json:"weights,omitempty"`
	// LoRAAdapters are adapter names served by this pool; a request naming one is
	// routed here. An adapter name is unique in the configuration: neither
	// another adapter nor any scheduler's modelName.
	// +kubebuilder:validation:MaxItems=50
	// +kubebuilder:validation:items:MinLength=1
	// +listType=set
	// +optional
	LoRAAdapters []string `json:"loraAdapters,omitempty"`
	// Saturation marks an endpoint too busy to take more; saturated endpoints are
	// passed over unless every endpoint is saturated.
	// +optional
	Saturation *SaturationSpec `json:"saturation,omitempty"`
	// Prefix tunes the prefix-affinity index.
	// +optional
	Prefix *PrefixSpec `json:"prefix,omitempty"`
	// RouteTimeout bounds a request from arrival to its last byte (default 10m;
	// 0s disables it).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	RouteTimeout *metav1.Duration `json:"routeTimeout,omitempty"`
	// TTFTSLO is the time to first token this pool's requests should get, as
	// predicted from each endpoint's learned speed; an objective's ttftSLO
	// overrides it. When no endpoint is predicted to meet it, a sheddable
	// request is refused at once with 429 and Retry-After, any other goes to
	// the best endpoint; both are counted. Unset or 0s sets none.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	TTFTSLO *metav1.Duration `json:"ttftSLO,omitempty"`
	// SessionAffinity returns a session's requests to the endpoint that served
	// it last, which holds its conversation's KV cache, while that endpoint
	// is healthy, unsaturated and within its share of the load.
	// +optional
	SessionAffinity *SessionAffinitySpec `json:"sessionAffinity,omitempty"`
	// Replicas is refused: the endpoint picker runs inside kvgate, so scale the
	// kvgate Deployment instead (Helm value replicas).
	//
	// Deprecated: kept only so that a document carrying it decodes and is
	// refused with that message rather than as an unknown field.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
}

// BackendTLSSpec checks the model servers' certificates and, with certFile
// and keyFile, presents kvgate's own to servers that require one (mTLS).
//
// +kubebuilder:validation:XValidation:rule="has(self.certFile) == has(self.keyFile)",message="certFile and keyFile go together"
type BackendTLSSpec struct {
	// CAFile is a PEM bundle of the CAs that sign the model servers'
	// certificates (default: the system's), reread when it changes.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	CAFile string `json:"caFile,omitempty"`
	// ServerName is the name the certificates must carry (default: the
	// endpoint's host, an IP address for pods).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServerName string `json:"serverName,omitempty"`
	// CertFile is the PEM certificate chain kvgate presents to model servers
	// that ask for a client certificate, reread when it changes.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	CertFile string `json:"certFile,omitempty"`
	// KeyFile is CertFile's private key (PEM), reread with it.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	KeyFile string `json:"keyFile,omitempty"`
}

// MetricMap says where a model server publishes each signal: a metric, the
// label values that select its series, and a scale. A signal left out is one
// the server does not publish; the scorer that reads it then sits out.
//
// +kubebuilder:validation:XValidation:rule="has(self.kvUsed) == has(self.kvTotal)",message="kvUsed and kvTotal go together: usage is kvUsed / kvTotal"
type MetricMap struct {
	// Queue: requests waiting, the sum of the series selected.
	// +optional
	Queue *MetricSource `json:"queue,omitempty"`
	// Running: requests being served, the sum of the series selected.
	// +optional
	Running *MetricSource `json:"running,omitempty"`
	// KVUsage: the share of the KV cache in use, 0..1 after scale (a
	// percentage takes scale 0.01); the largest of the series selected.
	// +optional
	KVUsage *MetricSource `json:"kvUsage,omitempty"`
	// KVUsed: the KV cache in use, in the unit of kvTotal (blocks, tokens,
	// bytes), summed; usage is kvUsed / kvTotal when the exposition lacks
	// kvUsage.
	// +optional
	KVUsed *MetricSource `json:"kvUsed,omitempty"`
	// KVTotal: the KV cache in all, in the unit of kvUsed, summed.
	// +optional
	KVTotal *MetricSource `json:"kvTotal,omitempty"`
	// BlockSize: tokens per KV block.
	// +optional
	BlockSize *IntegerSource `json:"blockSize,omitempty"`
	// NumBlocks: KV blocks in all.
	// +optional
	NumBlocks *IntegerSource `json:"numBlocks,omitempty"`
	// LoRA: the adapters loaded, from the labels of an info metric.
	// +optional
	LoRA *LoRASource `json:"lora,omitempty"`
}

// MetricSelector is a metric's series: its name and label matchers.
type MetricSelector struct {
	// Name of the metric as the exposition spells it.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_:][a-zA-Z0-9_:]*$`
	Name string `json:"name"`
	// Labels keeps the series whose labels have these values; an empty
	// value matches a series without the label.
	// +kubebuilder:validation:MaxProperties=16
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// MetricSource is a signal read from the value of a metric's series.
type MetricSource struct {
	MetricSelector `json:",inline"`
	// Scale multiplies the value read (default 1).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +optional
	Scale Decimal `json:"scale,omitempty"`
}

// IntegerSource is a count read from a series' value or, with label, from a
// label of an info metric (as vLLM's cache_config_info{block_size}).
type IntegerSource struct {
	MetricSource `json:",inline"`
	// Label holding the number, in the first series selected.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	// +optional
	Label string `json:"label,omitempty"`
}

// LoRASource reads the LoRA adapters from the labels of an info metric: of the
// series selected, the one of largest value (vLLM's lora_requests_info keeps a
// series per state, valued by the time it was set).
type LoRASource struct {
	MetricSelector `json:",inline"`
	// RunningLabel lists the adapters loaded, comma-separated.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	RunningLabel string `json:"runningLabel"`
	// WaitingLabel lists the adapters requests wait for, comma-separated.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	// +optional
	WaitingLabel string `json:"waitingLabel,omitempty"`
	// MaxLabel holds how many adapters fit at once.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	// +optional
	MaxLabel string `json:"maxLabel,omitempty"`
}

// The int32 fields without a tighter bound carry Maximum=2147483647: without
// it the API server would store a larger number, which kvgate cannot decode.

// Weights of the scorers; each is a non-negative integer.
type Weights struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Queue *int32 `json:"queue,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	KVCache *int32 `json:"kvCache,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Prefix *int32 `json:"prefix,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	LoRAAffinity *int32 `json:"loraAffinity,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	RunningRequests *int32 `json:"runningRequests,omitempty"`
	// PrefillQueue weighs the prompt tokens this gateway has queued at an endpoint
	// that await their first token.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	PrefillQueue *int32 `json:"prefillQueue,omitempty"`
	// ErrorRate weighs the share of an endpoint's recent answers that failed.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	ErrorRate *int32 `json:"errorRate,omitempty"`
	// PredictedLatency weighs each endpoint's predicted time to first token
	// for the request, from the speed learned of its answers.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	PredictedLatency *int32 `json:"predictedLatency,omitempty"`
	// SessionAffinity weighs returning to the endpoint that served the
	// request's session (default 6 when sessionAffinity is set).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	SessionAffinity *int32 `json:"sessionAffinity,omitempty"`
	// TokenLoad weighs the uncached prompt tokens awaiting their first token
	// at an endpoint, this request's included (llm-d's token-load scorer).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	TokenLoad *int32 `json:"tokenLoad,omitempty"`
	// KVCost weighs Dynamo's KV-router cost: the prefill blocks still to
	// compute at an endpoint plus its active KV blocks.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	KVCost *int32 `json:"kvCost,omitempty"`
}

// SessionAffinitySpec says where a request's session key comes from.
// +kubebuilder:validation:XValidation:rule="!(has(self.header) && has(self.fromUser) && self.fromUser)",message="header and fromUser are exclusive: the key comes from one place"
type SessionAffinitySpec struct {
	// Header names the request header carrying the session key (default
	// x-session-id).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!#$%&'*+.^_|~0-9A-Za-z-]+$`
	// +optional
	Header string `json:"header,omitempty"`
	// FromUser takes the key from the body's "user" field (the OpenAI
	// API's end-user id) instead of a header.
	// +optional
	FromUser bool `json:"fromUser,omitempty"`
	// TTL is how long a session is remembered after its last request
	// (default 30m).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) > duration('0s'))",message="must be above 0s and fit in a Go time.Duration",optionalOldSelf=true
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// SaturationSpec holds the thresholds at which an endpoint counts as saturated.
type SaturationSpec struct {
	// QueueDepth: this many waiting requests or more saturate (default 5).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	QueueDepth *int32 `json:"queueDepth,omitempty"`
	// KVCachePercent: KV-cache usage at or above this percentage saturates
	// (default 80).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	KVCachePercent *int32 `json:"kvCachePercent,omitempty"`
}

// PrefixSpec tunes the approximate prefix-cache index.
type PrefixSpec struct {
	// BlockChars is the size of a prompt block in characters (default 64, about
	// 16 tokens).
	// +kubebuilder:validation:Minimum=8
	// +kubebuilder:validation:Maximum=4096
	// +optional
	BlockChars *int32 `json:"blockChars,omitempty"`
	// MaxBlocks is how many leading blocks of a prompt are matched (default 256).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	// +optional
	MaxBlocks *int32 `json:"maxBlocks,omitempty"`
	// CapacityBlocks is how many blocks an endpoint is remembered to hold when its
	// metrics do not give its KV-cache size (default 31250).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	CapacityBlocks *int32 `json:"capacityBlocks,omitempty"`
}

// ScrapeSpec tunes how model-server metrics are read.
//
// +kubebuilder:validation:XValidation:rule="!has(self.staleAfter) || duration(self.staleAfter) >= (has(self.interval) ? duration(self.interval) : duration('50ms'))",message="must be at least the scrape interval (default 50ms)",fieldPath=".staleAfter"
type ScrapeSpec struct {
	// Interval between two scrapes of an endpoint (default 50ms).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('10ms') && duration(self) <= duration('1m'))",message="must be between 10ms and 1m",optionalOldSelf=true
	Interval *metav1.Duration `json:"interval,omitempty"`
	// Timeout of one scrape (default 1s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) > duration('0s') && duration(self) <= duration('1m'))",message="must be between 1ns and 1m",optionalOldSelf=true
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// StaleAfter: metrics older than this make an endpoint stale (default 2s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	StaleAfter *metav1.Duration `json:"staleAfter,omitempty"`
	// UnhealthyAfter consecutive failed scrapes make an endpoint unhealthy
	// (default 3).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	UnhealthyAfter *int32 `json:"unhealthyAfter,omitempty"`
}

// GatewaySpec tunes the data plane.
type GatewaySpec struct {
	// MaxAttempts is how many endpoints a request may try before its response
	// starts (default 3; 1 disables retries).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	// +optional
	MaxAttempts *int32 `json:"maxAttempts,omitempty"`
	// MaxInFlightPerEndpoint saturates an endpoint at this many requests in flight
	// through this gateway (default 0: no limit).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	MaxInFlightPerEndpoint *int32 `json:"maxInFlightPerEndpoint,omitempty"`
	// QueueTimeout is how long a request may wait for a saturated pool before 429
	// (default 1s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s') && duration(self) <= duration('1m'))",message="must be between 0s and 1m",optionalOldSelf=true
	QueueTimeout *metav1.Duration `json:"queueTimeout,omitempty"`
	// ConnectTimeout bounds dialling an endpoint (default 2s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) > duration('0s') && duration(self) <= duration('1m'))",message="must be between 1ns and 1m",optionalOldSelf=true
	ConnectTimeout *metav1.Duration `json:"connectTimeout,omitempty"`
	// ResponseHeaderTimeout bounds the wait for an endpoint's response headers
	// (default 5m: a non-streaming answer's headers come with its last token;
	// 0s: none). An endpoint that misses it is given up on for the next.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	ResponseHeaderTimeout *metav1.Duration `json:"responseHeaderTimeout,omitempty"`
	// FirstByteTimeout bounds the wait from a streamed response's headers to its
	// first event (default 15s; 0s: none). An endpoint that misses it is given
	// up on for the next.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	FirstByteTimeout *metav1.Duration `json:"firstByteTimeout,omitempty"`
	// StreamIdleTimeout ends a streamed response that sends nothing for this
	// long once it started, with an error event (default 30s; 0s: none).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	StreamIdleTimeout *metav1.Duration `json:"streamIdleTimeout,omitempty"`
	// ClientWriteTimeout ends a streamed request whose client has not taken a
	// write for about this long (default 30s; 0s: none), releasing its
	// endpoint: a client that stops reading cannot hold a slot.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('0s'))",message="must fit in a Go time.Duration (at most 2562047h)",optionalOldSelf=true
	ClientWriteTimeout *metav1.Duration `json:"clientWriteTimeout,omitempty"`
	// RetryBufferBytes is how much of a body is kept to replay it on a retry
	// (default 8 MiB); a larger body is streamed once and not retried.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RetryBufferBytes *int64 `json:"retryBufferBytes,omitempty"`
	// MaxBufferedBytes bounds the request bytes held in memory across all
	// requests at once: bodies read up to their model and the bytes kept to
	// replay them on a retry (default 536870912, 512 MiB). A request that
	// would need more is refused with 503 and Retry-After.
	// +kubebuilder:validation:Minimum=1048576
	// +optional
	MaxBufferedBytes *int64 `json:"maxBufferedBytes,omitempty"`
	// Diagnostics says who may read routing internals in answers.
	// +optional
	Diagnostics *DiagnosticsSpec `json:"diagnostics,omitempty"`
	// Scrape tunes how model-server metrics are read.
	// +optional
	Scrape *ScrapeSpec `json:"scrape,omitempty"`
	// OutlierDetection ejects endpoints that keep failing (as Envoy's outlier
	// detection does).
	// +optional
	OutlierDetection *OutlierSpec `json:"outlierDetection,omitempty"`
	// SharedState links the gateway's replicas through Redis, so that they
	// route as one (docs/scaling.md). The first configuration that names one
	// links the replica; a later change applies at its next start.
	// +optional
	SharedState *SharedStateSpec `json:"sharedState,omitempty"`
}

// DiagnosticsSpec lets clients read routing internals: x-kvgate-endpoint
// (the address of the endpoint that served) on every answer, and
// x-kvgate-scores (every candidate's address and scores) on an answer to a
// request carrying x-kvgate-explain: 1. Off by default: the addresses are
// the cluster's.
type DiagnosticsSpec struct {
	// Expose turns the headers on.
	Expose bool `json:"expose"`
	// Tenants, when set, limits them to requests authenticated (spec.auth)
	// as one of these tenants.
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MinLength=1
	// +listType=set
	// +optional
	Tenants []string `json:"tenants,omitempty"`
}

// SharedStateSpec is the Redis the replicas of one gateway share routing
// state through: their decisions (the prefix index), their loads on every
// endpoint between scrapes and their in-flight counts. The credentials, when
// Redis needs them, come from the environment variables
// KVGATE_SHARED_STATE_USERNAME and KVGATE_SHARED_STATE_PASSWORD (in
// Kubernetes, from a Secret).
type SharedStateSpec struct {
	// Redis is Redis's host:port.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Redis string `json:"redis"`
	// Cluster names the replicas that share state: the Redis keys are named
	// by it and a message carrying another is ignored (default: the
	// configuration's namespace/name, or its name outside Kubernetes).
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Cluster string `json:"cluster,omitempty"`
	// DB is the Redis database number (default 0).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=15
	// +optional
	DB *int32 `json:"db,omitempty"`
	// TLS, when set, connects to Redis over TLS.
	// +optional
	TLS *SharedStateTLS `json:"tls,omitempty"`
}

// SharedStateTLS is how Redis's certificate is checked.
type SharedStateTLS struct {
	// CAFile is a PEM bundle of the CAs that sign Redis's certificate
	// (default: the system's).
	// +optional
	CAFile string `json:"caFile,omitempty"`
	// ServerName is the name Redis's certificate must carry (default: the
	// host of redis).
	// +optional
	ServerName string `json:"serverName,omitempty"`
}

// OutlierSpec tunes passive outlier detection: an endpoint whose answers fail
// ConsecutiveFailures times in a row (5xx, connection failures, first-byte
// timeouts, broken streams) is ejected — picked only when nothing else is — for
// BaseEjectionTime times the number of its ejections so far, at most ten times
// it; at most MaxEjectionPercent of a scheduler's endpoints are ejected at once.
type OutlierSpec struct {
	// ConsecutiveFailures that eject an endpoint (default 5; 0 disables).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	ConsecutiveFailures *int32 `json:"consecutiveFailures,omitempty"`
	// BaseEjectionTime is the first ejection's length (default 30s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || (duration(self) >= duration('1s') && duration(self) <= duration('1h'))",message="must be between 1s and 1h",optionalOldSelf=true
	BaseEjectionTime *metav1.Duration `json:"baseEjectionTime,omitempty"`
	// MaxEjectionPercent of a scheduler's endpoints ejected at once (default 50).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxEjectionPercent *int32 `json:"maxEjectionPercent,omitempty"`
}

// InferenceGatewayConfigStatus is the observed state.
type InferenceGatewayConfigStatus struct {
	// ObservedGeneration is the generation being served: after a rejected edit,
	// the last accepted one (the Accepted condition's observedGeneration names
	// the latest seen).
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions Accepted (the latest generation) and Ready (what is served has
	// ready endpoints in every scheduler, now).
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Schedulers reports each served scheduler's endpoints and rollout.
	// +optional
	Schedulers []SchedulerStatus `json:"schedulers,omitempty"`
	// ServedSchedulers is the number of schedulers served (0 is written, so
	// that kubectl get shows it).
	// +optional
	ServedSchedulers int32 `json:"servedSchedulers"`
	// ReadyEndpoints is the number of endpoints served, over all schedulers.
	// +optional
	ReadyEndpoints int32 `json:"readyEndpoints"`
}

// SchedulerStatus is one scheduler's observed state.
type SchedulerStatus struct {
	Name string `json:"name"`
	// Endpoints is the number of ready endpoints.
	Endpoints int32 `json:"endpoints"`
	// RolloutState is Pending, Progressing, Available or Degraded.
	RolloutState string `json:"rolloutState,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
