package global

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/config"
)

// Kind and APIVersion of the global router's configuration document.
const (
	Kind       = "GlobalRouterConfig"
	APIVersion = "gateway.kvgate.io/v1alpha1"
)

// Config is the global router's configuration: its member clusters, each a
// tier-1 `kvgate serve`, and the policies it routes by.
type Config struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec       Spec              `json:"spec"`

	// deprecated are the former field names the file used, to log when the
	// configuration is applied.
	deprecated []string
}

// Spec is the configuration's body.
type Spec struct {
	Members []Member `json:"members"`
	// Models set per-model policies: the TTFT SLO cost shaping keeps, and
	// limits shared by every tenant.
	Models  []ModelPolicy `json:"models,omitempty"`
	Tenants []Tenant      `json:"tenants,omitempty"`
	Routing Routing       `json:"routing,omitempty"`
	// RateLimit, when set, enforces the tenants' and models' limits.
	RateLimit *RateLimit `json:"rateLimit,omitempty"`
	// Auth, when it lists API keys or a JWT issuer, requires every request to
	// the API to authenticate; the tenant comes from the key or a claim. It is
	// the spec.auth of an InferenceGatewayConfig, validated alike.
	Auth *v1alpha1.AuthSpec `json:"auth,omitempty"`
}

// Member is one tier-1 gateway.
type Member struct {
	Name string `json:"name"`
	// URL is the member's OpenAI API (its `kvgate serve --listen`).
	URL string `json:"url"`
	// AdminURL is its admin listener, where GET /summary is the heartbeat.
	AdminURL string `json:"adminURL"`
	Region   string `json:"region,omitempty"`
	// Price per million tokens; or per GPU-hour with the tokens a GPU serves
	// in an hour, from which the price per million tokens follows.
	PricePerMillionTokens *float64 `json:"pricePerMillionTokens,omitempty"`
	PricePerGPUHour       *float64 `json:"pricePerGPUHour,omitempty"`
	TokensPerGPUHour      *float64 `json:"tokensPerGPUHour,omitempty"`
	// Weight is the member's capacity relative to members of the same price
	// (default 1).
	Weight *float64 `json:"weight,omitempty"`
}

// ModelPolicy is what one model asks of routing.
type ModelPolicy struct {
	Name string `json:"name"`
	// TTFTSLO is the time to first token to keep (default routing.defaultTTFTSLO).
	TTFTSLO *metav1.Duration `json:"ttftSLO,omitempty"`
	// Limits are shared by all tenants for this model.
	Limits *Limits `json:"limits,omitempty"`
}

// Tenant is one client organisation, named by its API key or JWT claim.
type Tenant struct {
	Name string `json:"name"`
	// TTFTSLO overrides the model's SLO for this tenant's requests.
	TTFTSLO *metav1.Duration `json:"ttftSLO,omitempty"`
	// Limits are this tenant's, per model ("*": all models together).
	Limits []TenantLimit `json:"limits,omitempty"`
	// Objective, when set, is sent to the members as the
	// x-gateway-inference-objective header of this tenant's requests: its
	// priority in the member's spec.objectives orders them there. A client's
	// own header never passes.
	Objective string `json:"objective,omitempty"`
}

// Limits are per minute; 0 or absent: unlimited.
type Limits struct {
	RequestsPerMinute int64 `json:"requestsPerMinute,omitempty"`
	TokensPerMinute   int64 `json:"tokensPerMinute,omitempty"`
}

// TenantLimit is a tenant's limit on one model, or on all ("*").
type TenantLimit struct {
	Model  string `json:"model"`
	Limits `json:",inline"`
}

// Routing tunes member choice and failover.
type Routing struct {
	// HeartbeatInterval is how often each member's summary is read (default
	// 500ms); a member whose last good read is older than HeartbeatTimeout
	// (default 2s) is drained.
	HeartbeatInterval *metav1.Duration `json:"heartbeatInterval,omitempty"`
	HeartbeatTimeout  *metav1.Duration `json:"heartbeatTimeout,omitempty"`
	// RampUp is how long a returning member takes to get its full share
	// (default 30s).
	RampUp *metav1.Duration `json:"rampUp,omitempty"`
	// DefaultTTFTSLO applies to models without their own (default 2s).
	DefaultTTFTSLO *metav1.Duration `json:"defaultTTFTSLO,omitempty"`
	// MaxErrorRate puts members failing more of their recent requests last
	// (default 0.25).
	MaxErrorRate *float64 `json:"maxErrorRate,omitempty"`
	// RegionHeader names the client's region (default x-kvgate-region);
	// without it, a request's region is Region, where this router runs (its
	// clients are near it). CrossRegionLatency is added to a member's predicted
	// TTFT when it is in another region (default 50ms).
	RegionHeader       string           `json:"regionHeader,omitempty"`
	Region             string           `json:"region,omitempty"`
	CrossRegionLatency *metav1.Duration `json:"crossRegionLatency,omitempty"`
	// MaxAttempts bounds how many members a request may try (default 3).
	MaxAttempts *int32 `json:"maxAttempts,omitempty"`
	// FirstByteTimeout bounds the wait for the first byte of a member's answer
	// (its headers and the first bytes of its body) while the member stays
	// healthy; past it the member is given up on for that request and the next
	// one tried (default 15s, as kvgate serve's; 0: no bound). A member whose
	// heartbeat stops is given up on sooner.
	FirstByteTimeout *metav1.Duration `json:"firstByteTimeout,omitempty"`
	// StreamIdleTimeout ends a stream that sends nothing for this long once
	// it started, with an error event (default 30s, as kvgate serve's; 0: no
	// bound).
	StreamIdleTimeout *metav1.Duration `json:"streamIdleTimeout,omitempty"`
	// MaxBodyBytes bounds a request body, which is held whole so that it can be
	// sent to another member (default 32 MiB).
	MaxBodyBytes *int64 `json:"maxBodyBytes,omitempty"`
	// PriceBlind turns cost shaping off (members are chosen by load and weight
	// alone).
	PriceBlind bool `json:"priceBlind,omitempty"`
}

// RateLimit configures the shared limiter.
type RateLimit struct {
	// Redis is the address (host:port) of the Redis all replicas share.
	Redis string `json:"redis"`
	// FailMode when Redis cannot be reached: "open" (default: each replica
	// limits locally) or "closed" (requests are refused with 503).
	FailMode string `json:"failMode,omitempty"`
	// DefaultMaxTokens is the completion a request without max_tokens is
	// assumed to reserve (default 1024).
	DefaultMaxTokens *int64 `json:"defaultMaxTokens,omitempty"`
	// Timeout is the least wait for Redis's decision (default 200ms), longer
	// while Redis answers slowly, at most 10×; past it the fail mode decides
	// that request. A call unanswered in 10 × timeout marks Redis down.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// settings are the routing knobs with their defaults applied.
type settings struct {
	heartbeat, heartbeatTimeout, rampUp, defaultSLO, crossRegion time.Duration
	firstByteTimeout, streamIdle                                 time.Duration
	maxErrorRate                                                 float64
	regionHeader, region                                         string
	maxAttempts                                                  int
	maxBody                                                      int64
	priceBlind                                                   bool
}

func (r Routing) settings() settings {
	s := settings{
		heartbeat:        v1alpha1.DurationOr(r.HeartbeatInterval, 500*time.Millisecond),
		heartbeatTimeout: v1alpha1.DurationOr(r.HeartbeatTimeout, 2*time.Second),
		rampUp:           v1alpha1.DurationOr(r.RampUp, 30*time.Second),
		defaultSLO:       v1alpha1.DurationOr(r.DefaultTTFTSLO, 2*time.Second),
		crossRegion:      v1alpha1.DurationOr(r.CrossRegionLatency, 50*time.Millisecond),
		// Below the 60 s after which common proxies (nginx, AWS's load
		// balancers) cut a silent connection, as tier 1's (docs/configuration.md).
		firstByteTimeout: v1alpha1.DurationOr(r.FirstByteTimeout, v1alpha1.DefaultFirstByteTimeout),
		streamIdle:       v1alpha1.DurationOr(r.StreamIdleTimeout, v1alpha1.DefaultStreamIdleTimeout),
		maxErrorRate:     0.25,
		regionHeader:     "X-Kvgate-Region",
		maxAttempts:      3,
		maxBody:          32 << 20,
		priceBlind:       r.PriceBlind,
		region:           r.Region,
	}
	if r.MaxErrorRate != nil {
		s.maxErrorRate = *r.MaxErrorRate
	}
	if r.RegionHeader != "" {
		s.regionHeader = r.RegionHeader
	}
	if r.MaxAttempts != nil {
		s.maxAttempts = int(*r.MaxAttempts)
	}
	if r.MaxBodyBytes != nil {
		s.maxBody = *r.MaxBodyBytes
	}
	return s
}

// Load reads and checks a configuration file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// renamed are the fields of spec.auth whose tier-2 names gave way to the
// InferenceGatewayConfig's; the old names are read for one more release.
var renamed = []config.Renamed{
	{Path: "spec.auth.jwt", Old: "jwksURL", New: "jwksURI"},
	{Path: "spec.auth.jwt", Old: "audience", New: "audiences"},
}

// Parse decodes a configuration strictly — an unknown field or a value of
// the wrong kind is an error naming its path and line — and validates it.
func Parse(name string, data []byte) (*Config, error) {
	var c Config
	doc, err := config.Decode(name, data, &c, Kind, "apiVersion, kind, metadata and spec", renamed...)
	if err != nil {
		return nil, err
	}
	if err := doc.Check(c.problems()); err != nil {
		return nil, err
	}
	c.deprecated = doc.Deprecated()
	return &c, nil
}

// Deprecated lists the former field names the file used, one line each
// ("file:line: spec.auth.jwt.jwksURL is deprecated; use jwksURI").
func (c *Config) Deprecated() []string { return c.deprecated }

// Validate reports every problem with the configuration in one error.
func (c *Config) Validate() error {
	var errs []error
	for _, fe := range c.problems() {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

// problems are every problem with the configuration, by field path: one small
// validator a section.
func (c *Config) problems() []v1alpha1.FieldError {
	p := &problems{}
	p.errs = config.Kind(c.APIVersion, c.Kind, APIVersion, Kind)
	validateMembers(p, c.Spec.Members)
	validateModels(p, c.Spec.Models)
	validateTenants(p, c.Spec.Tenants)
	validateRouting(p, c.Spec.Routing)
	if a := c.Spec.Auth; a != nil {
		p.errs = append(p.errs, a.Validate("spec.auth")...)
	}
	validateRateLimit(p, c.Spec.RateLimit)
	return p.errs
}

// problems collects field errors.
type problems struct{ errs []v1alpha1.FieldError }

func (p *problems) add(path, format string, args ...any) {
	p.errs = append(p.errs, v1alpha1.FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

func validateMembers(p *problems, members []Member) {
	if len(members) == 0 {
		p.add("spec.members", "at least one member is needed")
	}
	names := map[string]bool{}
	for i, m := range members {
		at := fmt.Sprintf("spec.members[%d]", i)
		if m.Name == "" {
			p.add(at+".name", "required")
		} else if names[m.Name] {
			p.add(at+".name", "%q is used twice", m.Name)
		}
		names[m.Name] = true
		for _, f := range []struct{ field, url string }{{"url", m.URL}, {"adminURL", m.AdminURL}} {
			if pu, err := url.Parse(f.url); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				p.add(at+"."+f.field, "want an http(s) URL, got %q", f.url)
			}
		}
		switch {
		case m.PricePerMillionTokens != nil && m.PricePerGPUHour != nil:
			p.add(at, "set pricePerMillionTokens or pricePerGPUHour, not both")
		case m.PricePerMillionTokens != nil && *m.PricePerMillionTokens < 0:
			p.add(at+".pricePerMillionTokens", "must be ≥ 0")
		case m.PricePerGPUHour != nil && (*m.PricePerGPUHour < 0 || m.TokensPerGPUHour == nil || *m.TokensPerGPUHour <= 0):
			p.add(at, "pricePerGPUHour needs a positive tokensPerGPUHour")
		}
		if m.Weight != nil && *m.Weight <= 0 {
			p.add(at+".weight", "must be > 0")
		}
	}
}

func validateModels(p *problems, models []ModelPolicy) {
	seen := map[string]bool{}
	for i, m := range models {
		at := fmt.Sprintf("spec.models[%d]", i)
		if m.Name == "" || seen[m.Name] {
			p.add(at+".name", "required and unique, got %q", m.Name)
		}
		seen[m.Name] = true
		if m.TTFTSLO != nil && m.TTFTSLO.Duration <= 0 {
			p.add(at+".ttftSLO", "must be > 0")
		}
		if m.Limits != nil {
			m.Limits.validate(p, at+".limits")
		}
	}
}

func validateTenants(p *problems, tenants []Tenant) {
	seen := map[string]bool{}
	for i, tn := range tenants {
		at := fmt.Sprintf("spec.tenants[%d]", i)
		if tn.Name == "" || tn.Name == "*" || seen[tn.Name] {
			p.add(at+".name", "required, unique and not \"*\" (which names the model-wide limits), got %q", tn.Name)
		}
		if tn.TTFTSLO != nil && tn.TTFTSLO.Duration <= 0 {
			p.add(at+".ttftSLO", "must be > 0")
		}
		// Sent as a header to every member: a value the HTTP client refuses
		// would fail each attempt as if the member were down.
		if o := tn.Objective; o != "" && (len(o) > 253 || strings.TrimSpace(o) != o || !httpguts.ValidHeaderFieldValue(o)) {
			p.add(at+".objective", "must be a printable header value of at most 253 characters without surrounding spaces, got %q", o)
		}
		seen[tn.Name] = true
		models := map[string]bool{}
		for j, l := range tn.Limits {
			lat := fmt.Sprintf("%s.limits[%d]", at, j)
			if l.Model == "" || models[l.Model] {
				p.add(lat+".model", "required and unique (\"*\" for all models), got %q", l.Model)
			}
			models[l.Model] = true
			l.validate(p, lat)
		}
	}
}

func validateRouting(p *problems, r Routing) {
	for _, d := range []struct {
		field string
		d     *metav1.Duration
		zero  bool // 0 allowed
	}{
		{"heartbeatInterval", r.HeartbeatInterval, false}, {"heartbeatTimeout", r.HeartbeatTimeout, false},
		{"defaultTTFTSLO", r.DefaultTTFTSLO, false}, {"rampUp", r.RampUp, true},
		{"crossRegionLatency", r.CrossRegionLatency, true}, {"firstByteTimeout", r.FirstByteTimeout, true},
		{"streamIdleTimeout", r.StreamIdleTimeout, true},
	} {
		switch {
		case d.d == nil:
		case d.zero && d.d.Duration < 0:
			p.add("spec.routing."+d.field, "must be ≥ 0")
		case !d.zero && d.d.Duration <= 0:
			p.add("spec.routing."+d.field, "must be > 0")
		}
	}
	if st := r.settings(); st.heartbeat > 0 && st.heartbeatTimeout > 0 && st.heartbeatTimeout < st.heartbeat {
		p.add("spec.routing.heartbeatTimeout", "must be at least heartbeatInterval, or every member flaps")
	}
	if r.MaxBodyBytes != nil && *r.MaxBodyBytes <= 0 {
		p.add("spec.routing.maxBodyBytes", "must be > 0")
	}
	if r.MaxAttempts != nil && (*r.MaxAttempts < 1 || *r.MaxAttempts > 10) {
		p.add("spec.routing.maxAttempts", "must be 1..10")
	}
	if r.MaxErrorRate != nil && (*r.MaxErrorRate <= 0 || *r.MaxErrorRate > 1) {
		p.add("spec.routing.maxErrorRate", "must be in (0, 1]")
	}
}

func validateRateLimit(p *problems, rl *RateLimit) {
	if rl == nil {
		return
	}
	if rl.Redis == "" {
		p.add("spec.rateLimit.redis", "required (host:port)")
	}
	if rl.DefaultMaxTokens != nil && *rl.DefaultMaxTokens <= 0 {
		p.add("spec.rateLimit.defaultMaxTokens", "must be > 0")
	}
	if rl.Timeout != nil && rl.Timeout.Duration <= 0 {
		p.add("spec.rateLimit.timeout", "must be > 0")
	}
	if rl.FailMode != "" && rl.FailMode != "open" && rl.FailMode != "closed" {
		p.add("spec.rateLimit.failMode", "\"open\" or \"closed\", got %q", rl.FailMode)
	}
}

func (l Limits) validate(p *problems, at string) {
	if l.RequestsPerMinute < 0 || l.TokensPerMinute < 0 {
		p.add(at, "limits must be ≥ 0")
	}
}

// Price is the member's price per million tokens (0 when unset).
func (m Member) Price() float64 {
	switch {
	case m.PricePerMillionTokens != nil:
		return *m.PricePerMillionTokens
	case m.PricePerGPUHour != nil && m.TokensPerGPUHour != nil:
		return *m.PricePerGPUHour / *m.TokensPerGPUHour * 1e6
	}
	return 0
}

// CapacityWeight is the member's weight (default 1).
func (m Member) CapacityWeight() float64 {
	if m.Weight != nil {
		return *m.Weight
	}
	return 1
}
