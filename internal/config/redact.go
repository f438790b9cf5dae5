package config

import (
	"net/url"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// redactedValue stands in for a secret, as net/url's Redacted writes it.
const redactedValue = "xxxxx"

// RedactURL is raw fit to log or show: the password of its user information
// and every query value (signed URLs and API keys travel there) replaced. A
// URL that does not parse is not shown at all, since its secrets cannot be
// found in it.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			for i := range vs {
				vs[i] = redactedValue
			}
			q[k] = vs
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// Redacted is a copy of cfg that holds no secret, for /debug/config: URL
// credentials redacted, API key hashes (unsalted SHA-256, enough to try
// guesses offline) replaced, and the annotations and managed fields dropped
// (kubectl apply's last-applied-configuration annotation is a whole copy of
// the spec). Tenant names stay: the page that shows them is behind the admin
// listener's authentication.
func Redacted(cfg *v1alpha1.InferenceGatewayConfig) *v1alpha1.InferenceGatewayConfig {
	if cfg == nil {
		return nil
	}
	out := cfg.DeepCopy()
	out.Annotations, out.ManagedFields = nil, nil
	out.Spec.Auth = RedactedAuth(out.Spec.Auth)
	return out
}

// RedactedAuth is a copy of a without its secrets: the JWKS URL's
// credentials redacted and the API key hashes replaced (kvgate serve's and
// kvgate global's spec.auth alike).
func RedactedAuth(a *v1alpha1.AuthSpec) *v1alpha1.AuthSpec {
	if a == nil {
		return nil
	}
	out := a.DeepCopy()
	if out.JWT != nil {
		out.JWT.JWKSURI = RedactURL(out.JWT.JWKSURI)
	}
	for i := range out.APIKeys {
		out.APIKeys[i].Hash = redactedValue
	}
	return out
}
