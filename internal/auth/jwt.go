package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// Errors of the key lookup, told apart in classify.
var (
	errUnknownKID  = errors.New("no key of the JWKS has the token's kid")
	errNoKey       = errors.New("no key of the JWKS fits the token's algorithm")
	errNoKeySet    = errors.New("JWKS not loaded")
	errKeyMismatch = errors.New("the key named by kid does not fit the token's algorithm")
)

// jwtVerifier checks bearer JWTs against a JWKS and reads their tenant.
type jwtVerifier struct {
	keys      *keySource
	parser    *jwt.Parser
	claim     string   // as configured, for messages
	claimPath []string // claim split at dots
	required  []requiredClaim
}

// requiredClaim is a ClaimRequirement with its name split at dots.
type requiredClaim struct {
	name   string
	path   []string
	values []string
}

func newJWTVerifier(spec *v1alpha1.JWTSpec, keys *keySource, now func() time.Time) *jwtVerifier {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(acceptedAlgs()),
		jwt.WithLeeway(spec.Skew()),
		jwt.WithTimeFunc(now),
		// A token without exp would be good forever once leaked.
		jwt.WithExpirationRequired(),
		// Numbers stay json.Number so that an integer tenant id keeps its
		// digits instead of passing through float64.
		jwt.WithJSONNumber(),
	}
	if spec.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(spec.Issuer))
	}
	if len(spec.Audiences) > 0 {
		opts = append(opts, jwt.WithAudience(spec.Audiences...))
	}
	claim := spec.TenantClaimName()
	v := &jwtVerifier{
		keys: keys, parser: jwt.NewParser(opts...),
		claim: claim, claimPath: strings.Split(claim, "."),
	}
	for _, rc := range spec.RequiredClaims {
		v.required = append(v.required, requiredClaim{name: rc.Name, path: strings.Split(rc.Name, "."), values: rc.Values})
	}
	return v
}

// holds says whether a claim's value carries one of values: a string equal to
// one or, as OAuth's scope, holding one as a space-separated word; a list
// holding one; a number or boolean whose text is one.
func holds(claim any, values []string) bool {
	switch c := claim.(type) {
	case string:
		if slices.Contains(values, c) {
			return true
		}
		for _, w := range strings.Fields(c) {
			if slices.Contains(values, w) {
				return true
			}
		}
	case []any:
		for _, e := range c {
			if s, ok := e.(string); ok && slices.Contains(values, s) {
				return true
			}
		}
	case json.Number:
		return slices.Contains(values, c.String())
	case bool:
		return slices.Contains(values, strconv.FormatBool(c))
	}
	return false
}

// verify checks the token and returns its tenant.
func (v *jwtVerifier) verify(raw string) (string, *Error) {
	claims := jwt.MapClaims{}
	tok, err := v.parser.ParseWithClaims(raw, claims, v.key)
	if err != nil {
		reason, detail := classify(tok, claims, err)
		return "", &Error{Method: MethodJWT, Reason: reason, Detail: detail, Err: err}
	}
	val, ok := lookupClaim(claims, v.claimPath)
	if !ok {
		return "", &Error{Method: MethodJWT, Reason: ReasonNoTenant, Detail: fmt.Sprintf("missing tenant claim %q", v.claim)}
	}
	tenant, ok := tenantString(val)
	if !ok {
		return "", &Error{Method: MethodJWT, Reason: ReasonNoTenant, Detail: fmt.Sprintf("tenant claim %q is not a non-empty string or integer", v.claim)}
	}
	for _, rc := range v.required {
		// The token is genuine but does not grant this: 403, as RFC 6750's
		// insufficient_scope. The value it carries is not echoed.
		if c, ok := lookupClaim(claims, rc.path); !ok || !holds(c, rc.values) {
			return "", &Error{Method: MethodJWT, Reason: ReasonClaimMismatch, Detail: fmt.Sprintf("claim %q does not hold a required value", rc.name)}
		}
	}
	return tenant, nil
}

// key is the jwt.Keyfunc: the keys of the JWKS that may have signed tok. A kid
// the set lacks triggers a rate-limited refresh, which is how a rotated-in key
// is picked up before the periodic refresh. A token without kid is tried
// against every key that fits its algorithm.
func (v *jwtVerifier) key(tok *jwt.Token) (any, error) {
	alg := tok.Method.Alg()
	kid, _ := tok.Header["kid"].(string)
	set := v.keys.current()
	if kid != "" && (set == nil || len(set.Key(kid)) == 0) {
		v.keys.refreshForUnknownKID()
		set = v.keys.current()
	}
	if set == nil {
		return nil, errNoKeySet
	}
	var found jwt.VerificationKeySet
	if kid != "" {
		named := set.Key(kid)
		if len(named) == 0 {
			return nil, errUnknownKID
		}
		for i := range named {
			if suits(&named[i], alg) {
				found.Keys = append(found.Keys, named[i].Key)
			}
		}
		if len(found.Keys) == 0 {
			return nil, errKeyMismatch
		}
		return found, nil
	}
	for i := range set.Keys {
		if suits(&set.Keys[i], alg) {
			found.Keys = append(found.Keys, set.Keys[i].Key)
		}
	}
	if len(found.Keys) == 0 {
		return nil, errNoKey
	}
	return found, nil
}

// classify turns a parse error into a Reason and a message for the client.
// tok and claims hold what could be decoded before the error.
func classify(tok *jwt.Token, claims jwt.MapClaims, err error) (Reason, string) {
	if tok != nil && tok.Header != nil {
		alg, _ := tok.Header["alg"].(string)
		if !slices.Contains(acceptedAlgs(), alg) {
			if tok.Method == nil {
				// An alg jwt/v5 does not know: not echoed, it is free text.
				return ReasonUnsupportedAlg, "unknown signing algorithm"
			}
			return ReasonUnsupportedAlg, fmt.Sprintf("signing algorithm %q is not accepted", alg)
		}
	}
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return ReasonMalformed, "malformed"
	case errors.Is(err, errUnknownKID), errors.Is(err, errNoKey):
		return ReasonUnknownKID, "unknown signing key"
	case errors.Is(err, errNoKeySet):
		return ReasonUnknownKID, "signing keys unavailable"
	case errors.Is(err, errKeyMismatch):
		return ReasonBadSignature, "signing key does not fit the algorithm"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return ReasonBadSignature, "signature is invalid"
	case errors.Is(err, jwt.ErrTokenExpired):
		return ReasonExpired, "expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return ReasonNotYetValid, "not yet valid"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return ReasonWrongIssuer, "wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return ReasonWrongAudience, "wrong audience"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		// jwt/v5 does not say which; the only ones it requires are these.
		for _, c := range []string{"exp", "iss", "aud"} {
			if _, ok := claims[c]; !ok {
				return ReasonMissingClaim, fmt.Sprintf("missing %s claim", c)
			}
		}
		return ReasonMissingClaim, "missing required claim"
	}
	return ReasonInvalid, "invalid claims"
}

// lookupClaim finds the claim at path (the configured name split at dots). At
// each level the longest run of segments that names a member wins, so that
// both {"org":{"id":1}} for "org.id" and Auth0's namespaced
// {"https://example.com/tenant":...} are found.
func lookupClaim(m map[string]any, path []string) (any, bool) {
	for n := len(path); n >= 1; n-- {
		v, ok := m[strings.Join(path[:n], ".")]
		if !ok {
			continue
		}
		if n == len(path) {
			return v, true
		}
		if sub, isObj := v.(map[string]any); isObj {
			if found, ok := lookupClaim(sub, path[n:]); ok {
				return found, true
			}
		}
	}
	return nil, false
}

// tenantString accepts a non-empty string or an integer as a tenant.
func tenantString(v any) (string, bool) {
	switch t := v.(type) {
	case string:
		return t, t != ""
	case json.Number:
		if _, err := t.Int64(); err == nil {
			return t.String(), true
		}
	}
	return "", false
}

// looksLikeJWT tells a compact JWS from an API key by its shape: three
// base64url parts separated by dots, the first two non-empty (the third is
// empty in an unsigned "alg":"none" token, which must still be refused as a
// JWT and not looked up as a key).
func looksLikeJWT(s string) bool {
	parts := 0
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			if !isBase64URL(s[i]) {
				return false
			}
			continue
		}
		if parts < 2 && i == start {
			return false
		}
		parts++
		start = i + 1
	}
	return parts == 3
}

func isBase64URL(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}
