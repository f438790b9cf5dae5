// Package auth authenticates OpenAI-style API requests to kvgate (serve, epp
// and global) and names their tenant, which rate limits and SLOs are keyed by.
// Its configuration is v1alpha1.AuthSpec, the spec.auth of both tiers.
//
// Two kinds of credentials are accepted:
//
//   - API keys, as "Authorization: Bearer <key>" (OpenAI SDKs) or
//     "api-key: <key>" (Azure OpenAI SDKs). The configuration holds only
//     "sha256:<hex>" hashes of the keys, each with its tenant; produce one
//     with HashKey or `printf %s "$KEY" | sha256sum`.
//   - JWTs, as "Authorization: Bearer <jwt>", signed by a key of a JWKS
//     fetched from a URL (RS*, PS*, ES*, EdDSA), with exp, nbf and, when
//     configured, iss and aud checked; the tenant is a configured claim.
//
// A bearer credential shaped like a JWT (three base64url parts) is verified as
// one when JWT is configured and looked up as an API key otherwise.
//
// Keys and tokens are never logged nor echoed in error messages.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// Identity.Method values.
const (
	MethodAPIKey    = "api_key"
	MethodJWT       = "jwt"
	MethodAnonymous = "anonymous"
)

// Identity is who sent an authenticated request.
type Identity struct {
	// Tenant names the customer: from the API key's entry or the JWT's
	// tenant claim; "" for anonymous requests.
	Tenant string
	// Method is MethodAPIKey, MethodJWT or MethodAnonymous.
	Method string
}

// Options are the Authenticator's dependencies; the zero value is usable.
type Options struct {
	// HTTPClient fetches the JWKS; default: a client of its own over
	// http.DefaultTransport. Each fetch is bounded by the configured
	// fetchTimeout whatever the client's own timeout.
	HTTPClient *http.Client
	// Logger reports JWKS refreshes and, at debug level, refused requests.
	// Default: slog.Default().
	Logger *slog.Logger
	// Now is the clock for exp/nbf and the unknown-kid rate limit; default
	// time.Now. The periodic refresh runs on real timers.
	Now func() time.Time
	// Registerer receives the kvgate_auth_* metrics; nil leaves them
	// unregistered. Registering on a registry that already holds them (a
	// configuration reload) reuses the registered ones.
	Registerer prometheus.Registerer
}

// Authenticator checks the credentials of requests. It is safe for concurrent
// use. When JWT is configured it refreshes the JWKS in the background until
// the context given to New ends or Close is called.
type Authenticator struct {
	keys      []keyEntry
	jwt       *jwtVerifier // nil unless JWT is configured
	anonymous bool
	m         *metrics
	log       *slog.Logger
	throttle  *throttle

	stop context.CancelFunc
	done chan struct{} // closed when the refresh loop has returned
}

// keyEntry is one configured API key.
type keyEntry struct {
	digest [sha256.Size]byte
	tenant string
}

// New validates spec (an InferenceGatewayConfig's or a GlobalRouterConfig's
// spec.auth) and builds an Authenticator. With JWT configured it fetches the
// JWKS once before returning (bounded by fetchTimeout); a failure there is
// logged, not returned, so that an identity provider's outage does not keep
// API-key clients out: JWTs are refused until a later fetch succeeds, and
// Ready says so.
func New(ctx context.Context, spec *v1alpha1.AuthSpec, opts Options) (*Authenticator, error) {
	if spec == nil {
		spec = &v1alpha1.AuthSpec{}
	}
	if problems := spec.Validate(""); len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = p.Error()
		}
		return nil, fmt.Errorf("invalid auth config: %s", strings.Join(msgs, "; "))
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	a := &Authenticator{anonymous: spec.AllowAnonymous, m: m, log: opts.Logger, throttle: newThrottle(opts.Now)}
	for _, k := range spec.APIKeys {
		d, _ := v1alpha1.KeyDigest(k.Hash) // checked by Validate
		a.keys = append(a.keys, keyEntry{digest: d, tenant: k.Tenant})
	}
	if len(a.keys) > 0 {
		m.requests.WithLabelValues(MethodAPIKey, "ok")
	}
	if a.anonymous {
		m.requests.WithLabelValues(MethodAnonymous, "ok")
	}
	if spec.JWT != nil {
		m.requests.WithLabelValues(MethodJWT, "ok")
		ctx, stop := context.WithCancel(ctx)
		src := newKeySource(ctx, spec.JWT, opts, m)
		failing := src.refresh(ctx, triggerStartup) != nil
		a.jwt = newJWTVerifier(spec.JWT, src, opts.Now)
		a.stop, a.done = stop, make(chan struct{})
		go func() {
			defer close(a.done)
			src.run(ctx, failing)
		}()
	}
	return a, nil
}

// HashKey is the configuration form of a raw API key: "sha256:<hex>".
func HashKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return v1alpha1.KeyHashPrefix + hex.EncodeToString(sum[:])
}

// Close stops the background JWKS refresh and waits for it to end.
func (a *Authenticator) Close() {
	if a.stop == nil {
		return
	}
	a.stop()
	<-a.done
}

// Ready reports whether every configured method can accept requests: nil
// unless JWT is configured and no JWKS has been loaded yet. For /readyz.
func (a *Authenticator) Ready() error {
	if a.jwt == nil {
		return nil
	}
	return a.jwt.keys.ready()
}

// Authenticate checks the request's credentials, its client address
// (RemoteAddr) throttled after failures. Every error it returns is an
// *Error, to be answered with WriteError.
func (a *Authenticator) Authenticate(r *http.Request) (Identity, error) {
	return a.AuthenticateFrom(r.Header, r.RemoteAddr)
}

// AuthenticateHeader is Authenticate for a front that has only the request's
// headers (the Envoy ext_proc picker): no client address, no throttle.
func (a *Authenticator) AuthenticateHeader(h http.Header) (Identity, error) {
	return a.AuthenticateFrom(h, "")
}

// AuthenticateFrom is Authenticate for the headers of a request from the
// client address client (host:port or an address; "" for none known): past
// ThrottleFailures refusals of a credential that does not verify within
// ThrottleWindow from the address, it is refused with ReasonThrottled before
// the credentials are looked at.
func (a *Authenticator) AuthenticateFrom(h http.Header, client string) (Identity, error) {
	key, keyed := clientKey(client)
	var id Identity
	var aerr *Error
	if wait := a.throttle.wait(key, keyed); wait > 0 {
		aerr = &Error{Reason: ReasonThrottled, RetryAfter: wait}
	} else if id, aerr = a.authenticate(&http.Request{Header: h}); aerr != nil && keyed && aerr.Reason.guess() {
		a.throttle.failed(key)
	}
	if aerr != nil {
		method := aerr.Method
		if method == "" {
			method = "none"
		}
		a.m.requests.WithLabelValues(method, string(aerr.Reason)).Inc()
		return Identity{}, aerr
	}
	a.m.requests.WithLabelValues(id.Method, "ok").Inc()
	return id, nil
}

// IsCredential says whether a request header carries credentials this package
// reads: a front strips them before the request goes upstream, as Envoy's
// jwt_authn does, since they were meant for the gateway.
func IsCredential(name string) bool {
	return strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Api-Key")
}

func (a *Authenticator) authenticate(r *http.Request) (Identity, *Error) {
	cred, aerr := credential(r.Header)
	if aerr != nil {
		return Identity{}, aerr
	}
	if cred == "" {
		if a.anonymous {
			return Identity{Method: MethodAnonymous}, nil
		}
		return Identity{}, &Error{Reason: ReasonMissing}
	}
	if a.jwt != nil && looksLikeJWT(cred) {
		tenant, aerr := a.jwt.verify(cred)
		if aerr != nil {
			return Identity{}, aerr
		}
		return Identity{Tenant: tenant, Method: MethodJWT}, nil
	}
	if tenant, ok := a.lookupKey(cred); ok {
		return Identity{Tenant: tenant, Method: MethodAPIKey}, nil
	}
	return Identity{}, &Error{Method: MethodAPIKey, Reason: ReasonUnknownKey}
}

// lookupKey finds the tenant of a raw API key. It compares the key's digest
// with every configured one in constant time and without stopping at a
// match, so the time taken says nothing about which key, if any, matched.
// The cost is linear: about 10 ns per configured key.
func (a *Authenticator) lookupKey(raw string) (string, bool) {
	d := sha256.Sum256([]byte(raw))
	tenant, found := "", false
	for i := range a.keys {
		if subtle.ConstantTimeCompare(d[:], a.keys[i].digest[:]) == 1 {
			tenant, found = a.keys[i].tenant, true
		}
	}
	return tenant, found
}

// credential extracts the bearer credential: Authorization: Bearer first,
// then api-key; "" when there is none. A header given twice is refused rather
// than guessed at, since a proxy in front may have checked the other copy.
func credential(h http.Header) (string, *Error) {
	authz, apiKey := h.Values("Authorization"), h.Values("Api-Key")
	if len(authz) > 1 || len(apiKey) > 1 {
		return "", &Error{Reason: ReasonMalformed, Detail: "more than one Authorization or api-key header",
			Err: errors.New("repeated credential header")}
	}
	if len(authz) == 1 {
		scheme, token, _ := strings.Cut(strings.TrimSpace(authz[0]), " ")
		if strings.EqualFold(scheme, "Bearer") {
			// An empty credential is a wrong one, not none: with anonymous
			// access allowed it must not pass as anonymous.
			if token = strings.TrimSpace(token); token == "" {
				return "", &Error{Reason: ReasonMalformed, Detail: "empty bearer token", Err: errors.New("empty bearer token")}
			}
			return token, nil
		}
		// Another scheme (Basic, say) may be meant for a proxy; an api-key
		// header beside it still counts.
		if len(apiKey) == 0 {
			return "", &Error{Reason: ReasonMalformed, Detail: "unsupported Authorization scheme, use Bearer",
				Err: errors.New("authorization scheme is not Bearer")}
		}
	}
	if len(apiKey) == 1 {
		if k := strings.TrimSpace(apiKey[0]); k != "" {
			return k, nil
		}
		return "", &Error{Reason: ReasonMalformed, Detail: "empty api-key", Err: errors.New("empty api-key header")}
	}
	return "", nil
}
