package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/config"
)

// Defaults of JWTConfig's optional fields.
const (
	DefaultTenantClaim     = "sub"
	DefaultRefreshInterval = 5 * time.Minute
	DefaultLeeway          = 30 * time.Second
	DefaultFetchTimeout    = 10 * time.Second

	// minRefreshInterval keeps a typo such as "5s" for "5m" from turning into a
	// fetch per request; one second is still short enough for tests.
	minRefreshInterval = time.Second
	// maxLeeway bounds the clock skew accepted on exp and nbf: more would make
	// an expired token good for far longer than its issuer meant.
	maxLeeway = 5 * time.Minute
)

// hashPrefix names the only hash the configuration accepts.
const hashPrefix = "sha256:"

// Config is the auth section of `kvgate global`'s configuration. Its zero value
// is invalid: with no API keys, no JWT and no anonymous access every request
// would be refused.
//
// In YAML:
//
//	apiKeys:
//	- tenant: acme
//	  hash: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//	jwt:
//	  jwksURL: https://idp.example.com/.well-known/jwks.json
//	  issuer: https://idp.example.com/
//	  audience: [kvgate]
//	  tenantClaim: org.id      # default sub
//	  refreshInterval: 5m      # default 5m
//	  leeway: 30s              # default 30s
//	  fetchTimeout: 10s        # default 10s
//	allowAnonymous: false
type Config struct {
	// APIKeys are the accepted API keys, stored as hashes only.
	APIKeys []APIKey `json:"apiKeys,omitempty"`
	// JWT, when set, accepts bearer tokens signed by a key of a JWKS.
	JWT *JWTConfig `json:"jwt,omitempty"`
	// AllowAnonymous lets requests without any credentials through with tenant
	// "" and method "anonymous". Requests with wrong credentials are refused
	// all the same: a bad key must not be downgraded to anonymous access.
	AllowAnonymous bool `json:"allowAnonymous,omitempty"`
}

// APIKey maps the hash of one API key to its tenant. Produce the hash with
// HashKey or in a shell:
//
//	printf %s "$KEY" | sha256sum | awk '{print "sha256:" $1}'
//
// printf rather than echo: echo appends a newline, which changes the hash.
type APIKey struct {
	Tenant string `json:"tenant"`
	// Hash is "sha256:" followed by the 64 hex digits of SHA-256 of the raw key.
	Hash string `json:"hash"`
}

// JWTConfig accepts JWTs signed by a key of the JWKS at JWKSURL.
type JWTConfig struct {
	// JWKSURL is where the signing keys are fetched from (http or https).
	JWKSURL string `json:"jwksURL"`
	// Issuer, when set, must equal the token's iss claim.
	Issuer string `json:"issuer,omitempty"`
	// Audience, when set, must share at least one value with the token's aud
	// claim.
	Audience []string `json:"audience,omitempty"`
	// TenantClaim names the claim holding the tenant (default "sub"). Dots
	// reach into nested objects: "org.id" reads {"org":{"id":...}}. A claim
	// whose own name holds dots, such as "https://example.com/tenant", is found
	// too: at each level the longest name that exists wins.
	TenantClaim string `json:"tenantClaim,omitempty"`
	// RefreshInterval is how often the JWKS is fetched again (default 5m).
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
	// Leeway is the clock skew allowed on exp and nbf (default 30s, at most 5m).
	Leeway *metav1.Duration `json:"leeway,omitempty"`
	// FetchTimeout bounds one fetch of the JWKS (default 10s).
	FetchTimeout *metav1.Duration `json:"fetchTimeout,omitempty"`
	// RequiredClaims the token must carry, each with one of its values (a
	// list holding one, or a space-separated string such as scope holding one
	// as a word); a token without is refused with 403.
	RequiredClaims []v1alpha1.ClaimRequirement `json:"requiredClaims,omitempty"`
}

// FromSpec is the configuration of an InferenceGatewayConfig's spec.auth.
func FromSpec(s *v1alpha1.AuthSpec) Config {
	c := Config{AllowAnonymous: s.AllowAnonymous}
	for _, k := range s.APIKeys {
		c.APIKeys = append(c.APIKeys, APIKey{Tenant: k.Tenant, Hash: strings.ToLower(k.Hash)})
	}
	if j := s.JWT; j != nil {
		c.JWT = &JWTConfig{JWKSURL: j.JWKSURI, Issuer: j.Issuer, Audience: j.Audiences, TenantClaim: j.TenantClaim,
			RefreshInterval: j.RefreshInterval, Leeway: j.Leeway, FetchTimeout: j.FetchTimeout, RequiredClaims: j.RequiredClaims}
	}
	return c
}

// ParseConfig decodes a YAML (or JSON) auth section strictly — an unknown
// field or a value of the wrong kind is an error naming its path and line —
// and validates it; name labels the errors.
func ParseConfig(name string, data []byte) (Config, error) {
	var cfg Config
	doc, err := config.Decode(name, data, &cfg, "auth section", "apiKeys, jwt or allowAnonymous")
	if err != nil {
		return Config{}, err
	}
	if err := doc.Check(cfg.Problems("")); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// HashKey is the configuration form of a raw API key: "sha256:<hex>".
func HashKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// parseHash returns the digest a configured hash names.
func parseHash(h string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	// The messages never quote the value: an operator who pasted the raw key
	// into the hash field would otherwise find it in the logs.
	hexPart, ok := strings.CutPrefix(h, hashPrefix)
	if !ok {
		return d, fmt.Errorf(`must start with %q (printf %%s "$KEY" | sha256sum)`, hashPrefix)
	}
	if len(hexPart) != hex.EncodedLen(sha256.Size) {
		return d, fmt.Errorf("want %d hex digits after %q, got %d characters", hex.EncodedLen(sha256.Size), hashPrefix, len(hexPart))
	}
	if _, err := hex.Decode(d[:], []byte(hexPart)); err != nil {
		return d, fmt.Errorf("not hexadecimal after %q", hashPrefix)
	}
	return d, nil
}

// Validate reports every problem of the configuration in one error, each with
// the path of its field.
func (c Config) Validate() error {
	problems := c.Problems("")
	if len(problems) == 0 {
		return nil
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Error()
	}
	return fmt.Errorf("invalid auth config: %s", strings.Join(msgs, "; "))
}

// Problems lists every problem of the configuration by field path, each path
// under at (the section's own path in the file that holds it; "" at the top).
func (c Config) Problems(at string) []v1alpha1.FieldError {
	var problems []v1alpha1.FieldError
	add := func(path, format string, args ...any) {
		problems = append(problems, v1alpha1.FieldError{Path: join(at, path), Message: fmt.Sprintf(format, args...)})
	}
	if len(c.APIKeys) == 0 && c.JWT == nil && !c.AllowAnonymous {
		add("", "no authentication configured: set apiKeys, jwt or allowAnonymous")
	}
	seen := make(map[[sha256.Size]byte]int, len(c.APIKeys))
	for i, k := range c.APIKeys {
		path := fmt.Sprintf("apiKeys[%d]", i)
		if strings.TrimSpace(k.Tenant) == "" {
			add(path+".tenant", "must not be empty")
		}
		d, err := parseHash(k.Hash)
		if err != nil {
			add(path+".hash", "%v", err)
			continue
		}
		// One key naming two tenants would make the tenant depend on the
		// order of the list; the same entry twice is a copy-paste slip.
		if j, dup := seen[d]; dup {
			add(path+".hash", "same key as apiKeys[%d] (tenant %q)", j, c.APIKeys[j].Tenant)
			continue
		}
		seen[d] = i
	}
	if c.JWT != nil {
		c.JWT.problems(func(path, format string, args ...any) { add("jwt."+path, format, args...) })
	}
	return problems
}

func join(at, path string) string {
	switch {
	case at == "":
		return path
	case path == "":
		return at
	}
	return at + "." + path
}

func (j *JWTConfig) problems(add func(path, format string, args ...any)) {
	if j.JWKSURL == "" {
		add("jwksURL", "required")
	} else if u, err := url.Parse(j.JWKSURL); err != nil {
		add("jwksURL", "%v", err)
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("jwksURL", "want an absolute http or https URL, got %q", j.JWKSURL)
	}
	for i, a := range j.Audience {
		if a == "" {
			add(fmt.Sprintf("audience[%d]", i), "must not be empty")
		}
	}
	if c := j.TenantClaim; c != "" && slices.Contains(strings.Split(c, "."), "") {
		add("tenantClaim", "%q has an empty name between dots", c)
	}
	if d := j.RefreshInterval; d != nil && d.Duration < minRefreshInterval {
		add("refreshInterval", "must be at least %v, got %v", minRefreshInterval, d.Duration)
	}
	if d := j.Leeway; d != nil && (d.Duration < 0 || d.Duration > maxLeeway) {
		add("leeway", "must be between 0 and %v, got %v", maxLeeway, d.Duration)
	}
	if d := j.FetchTimeout; d != nil && d.Duration <= 0 {
		add("fetchTimeout", "must be positive, got %v", d.Duration)
	}
	for i, rc := range j.RequiredClaims {
		if rc.Name == "" || slices.Contains(strings.Split(rc.Name, "."), "") {
			add(fmt.Sprintf("requiredClaims[%d].name", i), "must be a claim name, dots between non-empty names")
		}
		if len(rc.Values) == 0 {
			add(fmt.Sprintf("requiredClaims[%d].values", i), "must list at least one value")
		}
	}
}

func (j *JWTConfig) tenantClaim() string {
	if j.TenantClaim == "" {
		return DefaultTenantClaim
	}
	return j.TenantClaim
}

func (j *JWTConfig) refreshInterval() time.Duration {
	return v1alpha1.DurationOr(j.RefreshInterval, DefaultRefreshInterval)
}

func (j *JWTConfig) leeway() time.Duration { return v1alpha1.DurationOr(j.Leeway, DefaultLeeway) }

func (j *JWTConfig) fetchTimeout() time.Duration {
	return v1alpha1.DurationOr(j.FetchTimeout, DefaultFetchTimeout)
}
