package auth

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// Reason says why a request was not authenticated. It is the result label of
// kvgate_auth_requests_total, so the set is small and fixed.
type Reason string

// Reasons, with the credential kind they apply to.
const (
	ReasonMissing        Reason = "missing"         // no credentials at all
	ReasonMalformed      Reason = "malformed"       // an unusable header, or a token that does not parse
	ReasonUnknownKey     Reason = "unknown_key"     // api_key: no configured hash matches
	ReasonUnsupportedAlg Reason = "unsupported_alg" // jwt: alg is none, HMAC or unknown
	ReasonUnknownKID     Reason = "unknown_kid"     // jwt: no key of the JWKS fits the token's kid and alg
	ReasonBadSignature   Reason = "bad_signature"   // jwt: the signature does not verify
	ReasonExpired        Reason = "expired"         // jwt: exp is past (beyond the leeway)
	ReasonNotYetValid    Reason = "not_yet_valid"   // jwt: nbf is ahead (beyond the leeway)
	ReasonWrongIssuer    Reason = "wrong_issuer"    // jwt: iss differs from the configured issuer
	ReasonWrongAudience  Reason = "wrong_audience"  // jwt: aud names none of the configured audiences
	ReasonMissingClaim   Reason = "missing_claim"   // jwt: exp, or iss/aud when configured, is absent
	ReasonNoTenant       Reason = "no_tenant"       // jwt: the tenant claim is absent or not a string or integer
	ReasonInvalid        Reason = "invalid"         // jwt: any other claim problem
	ReasonClaimMismatch  Reason = "claim_mismatch"  // jwt: a required claim is absent or holds none of its values (403)
	ReasonThrottled      Reason = "throttled"       // too many refusals from the client's address: 429, not looked at
)

// guess says whether a refusal is of a credential that does not verify — a
// key or token that could be a guess — and so counts toward the throttle. A
// genuine token refused for its claims, its time or a key the JWKS in use
// lacks yet (a rotation), or a request without credentials, does not.
func (r Reason) guess() bool {
	switch r {
	case ReasonUnknownKey, ReasonBadSignature, ReasonMalformed, ReasonUnsupportedAlg:
		return true
	}
	return false
}

// Error is what Authenticate returns for every refused request. Its Message is
// safe to show the client: it never holds the key or the token.
type Error struct {
	// Method is the kind of credentials presented: "api_key", "jwt", or ""
	// when there were none.
	Method string
	Reason Reason
	// Detail is the client-facing reason of a refused JWT ("token is
	// expired"); empty for the other kinds.
	Detail string
	// Err is the underlying cause, for logs; may be nil.
	Err error
	// RetryAfter is how long a throttled client is still refused.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := "authentication failed"
	if e.Method != "" {
		s += " (" + e.Method + ")"
	}
	s += ": " + string(e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Message is the error message for the client, in the OpenAI API's style.
func (e *Error) Message() string {
	switch {
	case e.Reason == ReasonThrottled:
		return "Too many failed authentications from this address; retry later."
	case e.Reason == ReasonMissing:
		return "Missing credentials: set Authorization: Bearer <API key or token> (or api-key: <API key>)."
	case e.Method == MethodAPIKey:
		// Unlike OpenAI, no part of the key is echoed: the message may be logged.
		return "Incorrect API key provided."
	case e.Reason == ReasonClaimMismatch:
		return "Permission denied: the token's " + e.Detail + "."
	case e.Method == MethodJWT && e.Detail != "":
		return "Invalid token: " + e.Detail + "."
	case e.Detail != "":
		return "Invalid credentials: " + e.Detail + "."
	}
	return "Invalid credentials."
}

// StatusCode is the HTTP status of the answer: 403 for a genuine token that
// lacks a required claim, 429 for a throttled client, 401 otherwise.
func (e *Error) StatusCode() int {
	switch e.Reason {
	case ReasonClaimMismatch:
		return http.StatusForbidden
	case ReasonThrottled:
		return http.StatusTooManyRequests
	}
	return http.StatusUnauthorized
}

// Type is the OpenAI error type of the answer.
func (e *Error) Type() string {
	switch e.Reason {
	case ReasonClaimMismatch:
		return openai.TypePermission
	case ReasonThrottled:
		return openai.TypeRateLimit
	}
	return openai.TypeInvalidRequest
}

// RetryAfterSeconds is the Retry-After of the answer in whole seconds, rounded
// up; 0 sends none.
func (e *Error) RetryAfterSeconds() int {
	return int((e.RetryAfter + time.Second - 1) / time.Second)
}

// Challenge is the WWW-Authenticate value of RFC 6750 §3: a bare one when no
// credentials came, error="invalid_token" when they were refused,
// error="insufficient_scope" when a required claim is missing; none for a
// throttled client, whose credentials were not looked at.
func (e *Error) Challenge() string {
	switch e.Reason {
	case ReasonThrottled:
		return ""
	case ReasonMissing:
		return `Bearer realm="kvgate"`
	case ReasonClaimMismatch:
		return `Bearer realm="kvgate", error="insufficient_scope"`
	}
	return `Bearer realm="kvgate", error="invalid_token"`
}

// WriteError answers a request Authenticate refused: 401 (403 for a missing
// required claim) with a WWW-Authenticate challenge and an OpenAI-shaped
// body. An error of another type is answered the same way
// with a generic message, so that a caller's mistake fails closed.
func WriteError(w http.ResponseWriter, err error) {
	var ae *Error
	if !errors.As(err, &ae) {
		ae = &Error{Reason: ReasonInvalid}
	}
	if c := ae.Challenge(); c != "" {
		w.Header().Set("WWW-Authenticate", c)
	}
	if s := ae.RetryAfterSeconds(); s > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(s))
	}
	openai.WriteError(w, ae.StatusCode(), ae.Type(), ae.Message())
}
