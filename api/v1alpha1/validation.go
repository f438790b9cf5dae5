package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults applied where a field is unset.
const (
	DefaultTargetPort          = 8000
	DefaultMaxRequestBodyBytes = 256 << 20
	DefaultMaxAttempts         = 3
	DefaultQueueTimeout        = time.Second
	DefaultConnectTimeout      = 2 * time.Second
	DefaultRouteTimeout        = 10 * time.Minute
	DefaultSessionTTL          = 30 * time.Minute
	DefaultSessionHeader       = "x-session-id"
	DefaultHeaderTimeout       = 5 * time.Minute
	// The stall bounds sit below the 60 s of silence after which common
	// proxies and load balancers give up (nginx's proxy_read_timeout, AWS's
	// idle timeout), so a client behind one gets the gateway's explicit error,
	// not a cut: a stream silent for 30 s ends with an error event, and a
	// request whose attempts each wait 15 s for a first event is answered
	// within 3 × 15 s.
	DefaultFirstByteTimeout    = 15 * time.Second
	DefaultStreamIdleTimeout   = 30 * time.Second
	DefaultClientWriteTimeout  = 30 * time.Second
	DefaultOutlierFailures     = 5
	DefaultBaseEjectionTime    = 30 * time.Second
	DefaultMaxEjectionPercent  = 50
	DefaultRetryBufferBytes    = 8 << 20
	DefaultMaxBufferedBytes    = 512 << 20
	MinMaxBufferedBytes        = 1 << 20
	DefaultSaturationQueue     = 5
	DefaultSaturationKVPercent = 80
	DefaultPrefixBlockChars    = 64
	DefaultPrefixMaxBlocks     = 256
	DefaultPrefixCapacity      = 31_250
	DefaultScrapeInterval      = 50 * time.Millisecond
	DefaultScrapeTimeout       = time.Second
	DefaultStaleAfter          = 2 * time.Second
	DefaultUnhealthyAfter      = 3
	DefaultTenantClaim         = "sub"
	DefaultRefreshInterval     = 5 * time.Minute
	DefaultLeeway              = 30 * time.Second
	DefaultFetchTimeout        = 10 * time.Second
)

// App protocols of model servers.
const (
	AppProtocolHTTP  = "http"
	AppProtocolH2C   = "kubernetes.io/h2c"
	AppProtocolHTTPS = "https"
)

// TLS versions of TLSSpec.MinVersion.
var TLSVersions = []string{"1.2", "1.3"}

const (
	maxSchedulers    = 100
	maxObjectives    = 100
	maxAdapters      = 50
	maxBodyLimit     = 1 << 30
	maxAttemptsLimit = 10
)

// Messages the CRD's schema gives in the same words (its markers in types.go),
// so that kubectl apply and kvgate refuse a document alike.
const (
	MsgReplicas       = "replicas is not supported: scale the kvgate Deployment instead (Helm value replicas)"
	MsgEndpointSource = "must take its endpoints from exactly one of modelSelector, poolRef (Kubernetes) or endpoints (static)"
	MsgEmptySelector  = "selects every pod: give it matchLabels or matchExpressions"
	MsgMetricsEngine  = "needs an engineType: custom, or the built-in one whose map it overrides"
	MsgCustomMetrics  = "engineType custom needs metrics with at least one of queue, running and kvUsage (or kvUsed with kvTotal)"
	MsgKVUsedTotal    = "kvUsed and kvTotal go together: usage is kvUsed / kvTotal"
)

// The forms of Prometheus metric and label names: MetricSelector.Name and the
// label fields of IntegerSource and LoRASource carry them as Pattern markers.
const (
	MetricNamePattern = `^[a-zA-Z_:][a-zA-Z0-9_:]*$`
	LabelNamePattern  = `^[a-zA-Z_][a-zA-Z0-9_]*$`
)

var (
	metricName = regexp.MustCompile(MetricNamePattern)
	labelName  = regexp.MustCompile(LabelNamePattern)
)

// EngineCustom is the engineType whose metric map is all in metrics.
const EngineCustom = "custom"

const (
	maxMetricName  = 256
	maxLabelName   = 128
	maxLabelValues = 16
)

// HostPortPattern is what a static endpoint must match: host:port, the host a
// name or an IPv4 address, or an IPv6 address in brackets (as net.SplitHostPort
// reads them), and a decimal port between 1 and 65535. The items:Pattern marker
// on SchedulerSpec.Endpoints is the same expression.
const HostPortPattern = `^(\[[^\[\]]+\]|[^:\[\]]+):0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`

var hostPort = regexp.MustCompile(HostPortPattern)

// Known names for the enumerated fields.
var (
	Pickers  = []string{"kvgate", "least-request", "round-robin", "random", "power-of-two"}
	Profiles = []string{string(ProfileKvgate), string(ProfileChat), string(ProfileBatch), string(ProfileGIEDefault),
		string(ProfileLLMDSticky), string(ProfileDynamoKV)}
	EngineTypes = []string{"vllm", "sglang", "trtllm", "triton", "tgi", "llamacpp", EngineCustom}
)

// FieldError is one problem with a document, at a field path such as
// spec.schedulers[1].modelName.
type FieldError struct {
	Path    string
	Message string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Message }

// Validate checks the spec and returns every problem found, in document order.
func (c *InferenceGatewayConfig) Validate() []FieldError {
	var v fieldErrors
	s := &c.Spec
	if n := len(s.Schedulers); n == 0 || n > maxSchedulers {
		v.add("spec.schedulers", "must list between 1 and %d schedulers, found %d", maxSchedulers, n)
	}
	v.bbr(s)
	v.objectives(s.Objectives)
	names, models := map[string]int{}, map[string]string{}
	for i, sc := range s.Schedulers {
		v.scheduler(fmt.Sprintf("spec.schedulers[%d]", i), i, sc, names, models)
	}
	v.gateway(s.Gateway)
	v.auth(s)
	v.tls(s.TLS)
	// Errors in a stable, document-like order.
	slices.SortStableFunc(v, func(a, b FieldError) int { return strings.Compare(a.Path, b.Path) })
	return v
}

// fieldErrors collects the problems of one document; one method a section.
type fieldErrors []FieldError

func (v *fieldErrors) add(path, format string, args ...any) {
	*v = append(*v, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

func (v *fieldErrors) bbr(s *InferenceGatewayConfigSpec) {
	if len(s.Schedulers) > 1 && !s.BBR.Enabled {
		v.add("spec.bbr.enabled", "must be true when there is more than one scheduler: the model in the body picks the pool")
	}
	if b := s.BBR.MaxRequestBodyBytes; b != nil && (*b < 1024 || *b > maxBodyLimit) {
		v.add("spec.bbr.maxRequestBodyBytes", "must be between 1024 and %d, got %d", maxBodyLimit, *b)
	}
	if s.BBR.Replicas != nil {
		v.add("spec.bbr.replicas", MsgReplicas)
	}
}

func (v *fieldErrors) objectives(objs []ObjectiveSpec) {
	if len(objs) > maxObjectives {
		v.add("spec.objectives", "lists %d objectives, at most %d allowed", len(objs), maxObjectives)
	}
	seen := map[string]int{}
	for i, o := range objs {
		p := fmt.Sprintf("spec.objectives[%d]", i)
		switch j, dup := seen[o.Name]; {
		case o.Name == "":
			v.add(p+".name", "is required")
		case len(o.Name) > 253:
			v.add(p+".name", "must be at most 253 characters")
		case dup:
			v.add(p+".name", "%q is already the name of spec.objectives[%d]", o.Name, j)
		default:
			seen[o.Name] = i
		}
		if o.Priority < -1000 || o.Priority > 1000 {
			v.add(p+".priority", "must be between -1000 and 1000, got %d", o.Priority)
		}
		if o.TTFTSLO != nil && o.TTFTSLO.Duration < 0 {
			v.add(p+".ttftSLO", "must not be negative")
		}
	}
}

// scheduler checks spec.schedulers[i] (at p); names and models hold the
// names and models of the schedulers before it.
func (v *fieldErrors) scheduler(p string, i int, sc SchedulerSpec, names map[string]int, models map[string]string) {
	switch {
	case sc.Name == "":
		v.add(p+".name", "is required")
	case !isDNSLabel(sc.Name):
		v.add(p+".name", "%q must be a DNS label (lower-case letters, digits and '-', at most 63)", sc.Name)
	default:
		if j, dup := names[sc.Name]; dup {
			v.add(p+".name", "%q is already the name of spec.schedulers[%d]", sc.Name, j)
		}
		names[sc.Name] = i
	}
	if sc.ModelName == "" {
		v.add(p+".modelName", "is required")
	} else if other, dup := models[sc.ModelName]; dup {
		v.add(p+".modelName", "%q is already served by %s", sc.ModelName, other)
	} else {
		models[sc.ModelName] = p
	}
	if len(sc.LoRAAdapters) > maxAdapters {
		v.add(p+".loraAdapters", "lists %d adapters, at most %d allowed", len(sc.LoRAAdapters), maxAdapters)
	}
	for j, a := range sc.LoRAAdapters {
		ap := fmt.Sprintf("%s.loraAdapters[%d]", p, j)
		if a == "" {
			v.add(ap, "must not be empty")
		} else if other, dup := models[a]; dup {
			v.add(ap, "%q is already served by %s", a, other)
		} else {
			models[a] = ap
		}
	}
	v.endpoints(p, sc)
	checkEnum(v.add, p+".engineType", sc.EngineType, EngineTypes)
	v.metrics(p, sc)
	checkEnum(v.add, p+".picker", sc.Picker, Pickers)
	checkEnum(v.add, p+".profile", sc.Profile, Profiles)
	v.scoring(p, sc)
	if sc.RouteTimeout != nil && sc.RouteTimeout.Duration < 0 {
		v.add(p+".routeTimeout", "must not be negative")
	}
	if sc.TTFTSLO != nil && sc.TTFTSLO.Duration < 0 {
		v.add(p+".ttftSLO", "must not be negative")
	}
	if a := sc.SessionAffinity; a != nil {
		if a.FromUser && a.Header != "" {
			v.add(p+".sessionAffinity", "header and fromUser are exclusive: the key comes from one place")
		}
		if a.Header != "" && !headerName.MatchString(a.Header) {
			v.add(p+".sessionAffinity.header", "%q is not an HTTP header name", a.Header)
		}
		if a.TTL != nil && a.TTL.Duration <= 0 {
			v.add(p+".sessionAffinity.ttl", "must be above 0s")
		}
	}
	if sc.Replicas != nil {
		v.add(p+".replicas", MsgReplicas)
	}
	v.names(p+".allowedTenants", sc.AllowedTenants, 1000)
	if t := sc.BackendTLS; t != nil && sc.AppProtocol != AppProtocolHTTPS {
		v.add(p+".backendTLS", "applies only with appProtocol https")
	}
	if t := sc.BackendTLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		v.add(p+".backendTLS", "certFile and keyFile go together")
	}
}

// names checks a set of names: at most limit, none empty, none twice.
func (v *fieldErrors) names(p string, list []string, limit int) {
	if len(list) > limit {
		v.add(p, "lists %d names, at most %d allowed", len(list), limit)
	}
	seen := make(map[string]bool, len(list))
	for j, n := range list {
		switch {
		case n == "":
			v.add(fmt.Sprintf("%s[%d]", p, j), "must not be empty")
		case seen[n]:
			v.add(fmt.Sprintf("%s[%d]", p, j), "%q is listed twice", n)
		}
		seen[n] = true
	}
}

// MsgAllowedTenants is the refusal of allowedTenants without spec.auth.
const MsgAllowedTenants = "allowedTenants needs spec.auth: without it no request has a tenant"

func (v *fieldErrors) auth(s *InferenceGatewayConfigSpec) {
	if s.Auth != nil {
		*v = append(*v, s.Auth.Validate("spec.auth")...)
		return
	}
	for i, sc := range s.Schedulers {
		if len(sc.AllowedTenants) > 0 {
			v.add(fmt.Sprintf("spec.schedulers[%d].allowedTenants", i), MsgAllowedTenants)
		}
	}
}

// Bounds of JWTSpec's durations, which the CRD's markers repeat.
const (
	// MinRefreshInterval keeps a typo such as "5s" for "5m" from turning into
	// a fetch per request; one second is still short enough for tests.
	MinRefreshInterval = time.Second
	// MaxLeeway bounds the clock skew accepted on exp and nbf: more would
	// make an expired token good for far longer than its issuer meant.
	MaxLeeway  = 5 * time.Minute
	maxAPIKeys = 10000
)

// KeyHashPrefix names the only hash APIKeySpec.Hash accepts.
const KeyHashPrefix = "sha256:"

// KeyDigest is the SHA-256 digest an APIKeySpec.Hash names, in either case
// of hex. Its errors never quote the value: an operator who pasted the raw key
// into the hash field would otherwise find it in the logs and the status.
func KeyDigest(hash string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	hexPart, ok := strings.CutPrefix(hash, KeyHashPrefix)
	if !ok {
		return d, fmt.Errorf(`must start with %q (printf %%s "$KEY" | sha256sum)`, KeyHashPrefix)
	}
	if len(hexPart) != hex.EncodedLen(sha256.Size) {
		return d, fmt.Errorf("want %d hex digits after %q, got %d characters", hex.EncodedLen(sha256.Size), KeyHashPrefix, len(hexPart))
	}
	if _, err := hex.Decode(d[:], []byte(hexPart)); err != nil {
		return d, fmt.Errorf("not hexadecimal after %q", KeyHashPrefix)
	}
	return d, nil
}

// Validate checks an auth section whose path in its document is at
// ("spec.auth" in both tiers' documents; "" names the fields alone) and
// returns every problem found, each at the path of its field.
func (a *AuthSpec) Validate(at string) []FieldError {
	var v fieldErrors
	path := func(p string) string {
		switch {
		case at == "":
			return p
		case p == "":
			return at
		}
		return at + "." + p
	}
	if a.JWT == nil && len(a.APIKeys) == 0 && !a.AllowAnonymous {
		v.add(path(""), "no authentication configured: set apiKeys, jwt or allowAnonymous")
	}
	if len(a.APIKeys) > maxAPIKeys {
		v.add(path("apiKeys"), "lists %d keys, at most %d allowed", len(a.APIKeys), maxAPIKeys)
	}
	seen := make(map[[sha256.Size]byte]int, len(a.APIKeys))
	for i, k := range a.APIKeys {
		p := path(fmt.Sprintf("apiKeys[%d]", i))
		if strings.TrimSpace(k.Tenant) == "" {
			v.add(p+".tenant", "must not be empty")
		}
		d, err := KeyDigest(k.Hash)
		if err != nil {
			v.add(p+".hash", "%v", err)
			continue
		}
		// One key naming two tenants would make the tenant depend on the
		// order of the list; the same entry twice is a copy-paste slip.
		if j, dup := seen[d]; dup {
			v.add(p+".hash", "same key as %s (tenant %q)", path(fmt.Sprintf("apiKeys[%d]", j)), a.APIKeys[j].Tenant)
			continue
		}
		seen[d] = i
	}
	if j := a.JWT; j != nil {
		j.validate(&v, path("jwt"))
	}
	return v
}

// validate checks a JWTSpec at path p.
func (j *JWTSpec) validate(v *fieldErrors, p string) {
	if j.JWKSURI == "" {
		v.add(p+".jwksURI", "is required")
	} else if u, err := url.Parse(j.JWKSURI); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(p+".jwksURI", "want an absolute http or https URL, got %q", j.JWKSURI)
	}
	for i, au := range j.Audiences {
		if au == "" {
			v.add(fmt.Sprintf("%s.audiences[%d]", p, i), "must not be empty")
		}
	}
	if c := j.TenantClaim; c != "" && slices.Contains(strings.Split(c, "."), "") {
		v.add(p+".tenantClaim", "%q has an empty name between dots", c)
	}
	for i, rc := range j.RequiredClaims {
		rp := fmt.Sprintf("%s.requiredClaims[%d]", p, i)
		if rc.Name == "" || slices.Contains(strings.Split(rc.Name, "."), "") {
			v.add(rp+".name", "must be a claim name, dots between non-empty names")
		}
		if len(rc.Values) == 0 {
			v.add(rp+".values", "must list at least one value")
		}
	}
	if d := j.RefreshInterval; d != nil && d.Duration < MinRefreshInterval {
		v.add(p+".refreshInterval", "must be at least %v, got %v", MinRefreshInterval, d.Duration)
	}
	if d := j.Leeway; d != nil && (d.Duration < 0 || d.Duration > MaxLeeway) {
		v.add(p+".leeway", "must be between 0 and %v, got %v", MaxLeeway, d.Duration)
	}
	if d := j.FetchTimeout; d != nil && d.Duration <= 0 {
		v.add(p+".fetchTimeout", "must be positive, got %v", d.Duration)
	}
}

func (v *fieldErrors) tls(t *TLSSpec) {
	if t == nil {
		return
	}
	if (t.SecretName != "") == (t.CertFile != "") {
		v.add("spec.tls", "set secretName or certFile and keyFile, not both")
	}
	if (t.CertFile != "") != (t.KeyFile != "") {
		v.add("spec.tls", "certFile and keyFile go together")
	}
	if t.SecretName != "" && !isDNSSubdomain(t.SecretName) {
		v.add("spec.tls.secretName", "%q is not a Secret name", t.SecretName)
	}
	checkEnum(v.add, "spec.tls.minVersion", t.MinVersion, TLSVersions)
}

// headerName is an HTTP field name (RFC 9110 token), at most 256 characters.
var headerName = regexp.MustCompile(`^[!#$%&'*+.^_|~0-9A-Za-z-]{1,256}$`)

// endpoints checks where a scheduler's endpoints come from and how they are reached.
func (v *fieldErrors) endpoints(p string, sc SchedulerSpec) {
	// One source: in Kubernetes poolRef would win over modelSelector. (The
	// CRD's schema also refuses static endpoints beside either, which kvgate
	// would ignore there; Validate cannot, for it also checks the
	// configuration the controller resolves, whose endpoints are the pods the
	// selector or pool picked.)
	selector, pool := sc.ModelSelector != nil, sc.PoolRef != ""
	if selector && pool || !selector && !pool && len(sc.Endpoints) == 0 {
		v.add(p, MsgEndpointSource)
	}
	if pool && (len(sc.PoolRef) > 253 || !isDNSSubdomain(sc.PoolRef)) {
		v.add(p+".poolRef", "%q is not an object name (a DNS subdomain: lower-case letters, digits, '-' and '.', at most 253)", trimName(sc.PoolRef))
	}
	if ms := sc.ModelSelector; ms != nil && len(ms.MatchLabels) == 0 && len(ms.MatchExpressions) == 0 {
		v.add(p+".modelSelector", MsgEmptySelector)
	}
	for j, ep := range sc.Endpoints {
		if !hostPort.MatchString(ep) {
			v.add(fmt.Sprintf("%s.endpoints[%d]", p, j), "%q is not host:port with a port between 1 and 65535", ep)
		}
	}
	if sc.TargetPort != nil && (*sc.TargetPort < 1 || *sc.TargetPort > 65535) {
		v.add(p+".targetPort", "must be a port between 1 and 65535, got %d", *sc.TargetPort)
	}
	if sc.AppProtocol != "" && sc.AppProtocol != AppProtocolHTTP && sc.AppProtocol != AppProtocolH2C && sc.AppProtocol != AppProtocolHTTPS {
		v.add(p+".appProtocol", "%q is not %s, %s or %s", sc.AppProtocol, AppProtocolHTTP, AppProtocolH2C, AppProtocolHTTPS)
	}
}

// metrics checks a scheduler's metric map and that its engineType has one.
func (v *fieldErrors) metrics(p string, sc SchedulerSpec) {
	mm := sc.Metrics
	switch {
	case mm != nil && sc.EngineType == "":
		v.add(p+".metrics", MsgMetricsEngine)
	case sc.EngineType == EngineCustom && (mm == nil || mm.Queue == nil && mm.Running == nil && mm.KVUsage == nil && mm.KVUsed == nil):
		v.add(p+".metrics", MsgCustomMetrics)
	}
	if mm == nil {
		return
	}
	p += ".metrics"
	if (mm.KVUsed == nil) != (mm.KVTotal == nil) {
		v.add(p, MsgKVUsedTotal)
	}
	for _, s := range []struct {
		name string
		src  *MetricSource
	}{{"queue", mm.Queue}, {"running", mm.Running}, {"kvUsage", mm.KVUsage}, {"kvUsed", mm.KVUsed}, {"kvTotal", mm.KVTotal}} {
		if s.src != nil {
			v.metricSource(p+"."+s.name, *s.src)
		}
	}
	for _, s := range []struct {
		name string
		src  *IntegerSource
	}{{"blockSize", mm.BlockSize}, {"numBlocks", mm.NumBlocks}} {
		if s.src != nil {
			v.metricSource(p+"."+s.name, s.src.MetricSource)
			v.labelName(p+"."+s.name+".label", s.src.Label, false)
		}
	}
	if l := mm.LoRA; l != nil {
		v.selector(p+".lora", l.MetricSelector)
		v.labelName(p+".lora.runningLabel", l.RunningLabel, true)
		v.labelName(p+".lora.waitingLabel", l.WaitingLabel, false)
		v.labelName(p+".lora.maxLabel", l.MaxLabel, false)
	}
}

func (v *fieldErrors) metricSource(p string, s MetricSource) {
	v.selector(p, s.MetricSelector)
	if f, err := s.Scale.Float64(); err != nil {
		v.add(p+".scale", "%v", err)
	} else if s.Scale != "" && f <= 0 {
		v.add(p+".scale", "must be > 0, got %s", s.Scale)
	}
}

func (v *fieldErrors) selector(p string, s MetricSelector) {
	switch {
	case s.Name == "":
		v.add(p+".name", "is required")
	case len(s.Name) > maxMetricName || !metricName.MatchString(s.Name):
		v.add(p+".name", "%q is not a Prometheus metric name (%s, at most %d)", trimName(s.Name), MetricNamePattern, maxMetricName)
	}
	if len(s.Labels) > maxLabelValues {
		v.add(p+".labels", "has %d labels, at most %d allowed", len(s.Labels), maxLabelValues)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		v.labelName(p+".labels."+k, k, true)
	}
}

// labelName checks a Prometheus label name; required says whether "" is a problem.
func (v *fieldErrors) labelName(p, name string, required bool) {
	switch {
	case name == "" && required:
		v.add(p, "is required")
	case name != "" && (len(name) > maxLabelName || !labelName.MatchString(name)):
		v.add(p, "%q is not a Prometheus label name (%s, at most %d)", trimName(name), LabelNamePattern, maxLabelName)
	}
}

// scoring checks a scheduler's weights, saturation thresholds and prefix settings.
func (v *fieldErrors) scoring(p string, sc SchedulerSpec) {
	if w := sc.Weights; w != nil {
		for name, val := range w.ByName() {
			if val != nil && *val < 0 {
				v.add(p+".weights."+string(name), "must be ≥ 0, got %d", *val)
			}
		}
	}
	if st := sc.Saturation; st != nil {
		if val := st.QueueDepth; val != nil && *val < 1 {
			v.add(p+".saturation.queueDepth", "must be ≥ 1, got %d", *val)
		}
		if val := st.KVCachePercent; val != nil && (*val < 1 || *val > 100) {
			v.add(p+".saturation.kvCachePercent", "must be between 1 and 100, got %d", *val)
		}
	}
	if px := sc.Prefix; px != nil {
		if val := px.BlockChars; val != nil && (*val < 8 || *val > 4096) {
			v.add(p+".prefix.blockChars", "must be between 8 and 4096, got %d", *val)
		}
		if val := px.MaxBlocks; val != nil && (*val < 1 || *val > 4096) {
			v.add(p+".prefix.maxBlocks", "must be between 1 and 4096, got %d", *val)
		}
		if val := px.CapacityBlocks; val != nil && *val < 1 {
			v.add(p+".prefix.capacityBlocks", "must be ≥ 1, got %d", *val)
		}
	}
}

func (v *fieldErrors) gateway(g GatewaySpec) {
	if g.MaxAttempts != nil && (*g.MaxAttempts < 1 || *g.MaxAttempts > maxAttemptsLimit) {
		v.add("spec.gateway.maxAttempts", "must be between 1 and %d, got %d", maxAttemptsLimit, *g.MaxAttempts)
	}
	if g.MaxInFlightPerEndpoint != nil && *g.MaxInFlightPerEndpoint < 0 {
		v.add("spec.gateway.maxInFlightPerEndpoint", "must be ≥ 0")
	}
	if g.RetryBufferBytes != nil && *g.RetryBufferBytes < 0 {
		v.add("spec.gateway.retryBufferBytes", "must be ≥ 0")
	}
	if b := g.MaxBufferedBytes; b != nil && *b < MinMaxBufferedBytes {
		v.add("spec.gateway.maxBufferedBytes", "must be at least %d, got %d", MinMaxBufferedBytes, *b)
	}
	if d := g.Diagnostics; d != nil {
		v.names("spec.gateway.diagnostics.tenants", d.Tenants, 100)
	}
	if g.QueueTimeout != nil && (g.QueueTimeout.Duration < 0 || g.QueueTimeout.Duration > time.Minute) {
		v.add("spec.gateway.queueTimeout", "must be between 0s and 1m")
	}
	if g.ConnectTimeout != nil && (g.ConnectTimeout.Duration <= 0 || g.ConnectTimeout.Duration > time.Minute) {
		v.add("spec.gateway.connectTimeout", "must be between 1ns and 1m")
	}
	for _, t := range []struct {
		name string
		d    *metav1.Duration
	}{{"firstByteTimeout", g.FirstByteTimeout}, {"streamIdleTimeout", g.StreamIdleTimeout}, {"clientWriteTimeout", g.ClientWriteTimeout}} {
		if t.d != nil && t.d.Duration < 0 {
			v.add("spec.gateway."+t.name, "must not be negative")
		}
	}
	if g.ResponseHeaderTimeout != nil && g.ResponseHeaderTimeout.Duration < 0 {
		v.add("spec.gateway.responseHeaderTimeout", "must not be negative")
	}
	if o := g.OutlierDetection; o != nil {
		if o.ConsecutiveFailures != nil && *o.ConsecutiveFailures < 0 {
			v.add("spec.gateway.outlierDetection.consecutiveFailures", "must not be negative")
		}
		if o.BaseEjectionTime != nil && (o.BaseEjectionTime.Duration < time.Second || o.BaseEjectionTime.Duration > time.Hour) {
			v.add("spec.gateway.outlierDetection.baseEjectionTime", "must be between 1s and 1h, got %s", o.BaseEjectionTime.Duration)
		}
		if p := o.MaxEjectionPercent; p != nil && (*p < 0 || *p > 100) {
			v.add("spec.gateway.outlierDetection.maxEjectionPercent", "must be between 0 and 100, got %d", *p)
		}
	}
	if ss := g.SharedState; ss != nil {
		if _, _, err := net.SplitHostPort(ss.Redis); err != nil || ss.Redis == "" {
			v.add("spec.gateway.sharedState.redis", "must be host:port, got %q", ss.Redis)
		}
		if len(ss.Cluster) > 128 {
			v.add("spec.gateway.sharedState.cluster", "must be at most 128 characters")
		}
		if ss.DB != nil && (*ss.DB < 0 || *ss.DB > 15) {
			v.add("spec.gateway.sharedState.db", "must be between 0 and 15, got %d", *ss.DB)
		}
	}
	if sp := g.Scrape; sp != nil {
		if d := sp.Interval; d != nil && (d.Duration < 10*time.Millisecond || d.Duration > time.Minute) {
			v.add("spec.gateway.scrape.interval", "must be between 10ms and 1m, got %s", d.Duration)
		}
		if d := sp.Timeout; d != nil && (d.Duration <= 0 || d.Duration > time.Minute) {
			v.add("spec.gateway.scrape.timeout", "must be between 1ns and 1m, got %s", d.Duration)
		}
		if d := sp.StaleAfter; d != nil && d.Duration < g.ScrapeInterval() {
			v.add("spec.gateway.scrape.staleAfter", "must be at least the scrape interval (%s), got %s", g.ScrapeInterval(), d.Duration)
		}
		if val := sp.UnhealthyAfter; val != nil && *val < 1 {
			v.add("spec.gateway.scrape.unhealthyAfter", "must be ≥ 1, got %d", *val)
		}
	}
}

func checkEnum(add func(string, string, ...any), path, v string, known []string) {
	if v != "" && !slices.Contains(known, v) {
		add(path, "%q is not one of %s", v, strings.Join(known, ", "))
	}
}

func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		lower, digit := c >= 'a' && c <= 'z', c >= '0' && c <= '9'
		if !lower && !digit && c != '-' {
			return false
		}
	}
	return true
}

// isDNSSubdomain reports whether s is a Kubernetes object name: dot-separated
// DNS labels.
func isDNSSubdomain(s string) bool {
	for _, label := range strings.Split(s, ".") {
		if !isDNSLabel(label) {
			return false
		}
	}
	return s != ""
}

// trimName shortens a long value quoted in a message.
func trimName(s string) string {
	if r := []rune(s); len(r) > 64 {
		return string(r[:61]) + "..."
	}
	return s
}
