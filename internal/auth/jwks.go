package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/config"
)

const (
	// unknownKIDInterval is how long after any fetch of the JWKS a token
	// with an unknown kid may cause another: an attacker sending random kids
	// must not turn the gateway into a client hammering the identity
	// provider. It is also the retry delay after a failed periodic fetch.
	unknownKIDInterval = 30 * time.Second
	// maxJWKSBytes bounds the body read from the JWKS URL; real sets are a few
	// KB.
	maxJWKSBytes = 1 << 20
	// minRSABits refuses keys too weak to trust (RFC 8725 §3.5 and NIST).
	minRSABits = 2048
)

// keySource holds the signing keys of one JWKS URL: fetched at startup,
// refreshed periodically and on a token with an unknown kid, and kept when a
// refresh fails, so that an identity provider's outage does not log every
// client out.
type keySource struct {
	url      string // for fetching
	logURL   string // for logs: without a password
	client   *http.Client
	timeout  time.Duration
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
	m        *metrics
	// ctx is the Authenticator's lifetime: fetches for a request's unknown kid
	// use it rather than the request's context, so that a client going away
	// does not abort a fetch other requests are waiting on.
	ctx context.Context

	keys atomic.Pointer[jose.JSONWebKeySet] // nil until the first good fetch
	// lastErr is the error of the last fetch, nil after a good one. Atomic
	// rather than under mu, so that a readiness probe never waits on a fetch.
	lastErr atomic.Pointer[fetchError]

	mu          sync.Mutex // one fetch at a time; guards the fields below
	lastAttempt time.Time  // by now(); rate-limits fetches for unknown kids
	lastLogged  string     // the kids logged last, to log changes only
}

// fetchError boxes an error for atomic.Pointer.
type fetchError struct{ err error }

func newKeySource(ctx context.Context, spec *v1alpha1.JWTSpec, opts Options, m *metrics) *keySource {
	return &keySource{
		url: spec.JWKSURI, logURL: config.RedactURL(spec.JWKSURI), client: opts.HTTPClient,
		timeout: spec.Fetch(), interval: spec.Refresh(),
		now: opts.Now, log: opts.Logger, m: m, ctx: ctx,
	}
}

// current is the key set in use; nil before the first good fetch.
func (s *keySource) current() *jose.JSONWebKeySet { return s.keys.Load() }

// ready reports why no key set is in use yet, or nil.
func (s *keySource) ready() error {
	if s.keys.Load() != nil {
		return nil
	}
	if last := s.lastErr.Load(); last != nil {
		return fmt.Errorf("JWKS from %s not loaded: %w", s.logURL, last.err)
	}
	return fmt.Errorf("JWKS from %s not loaded yet", s.logURL)
}

// run refreshes the keys every interval until ctx ends. After a failure it
// tries again sooner, as keys may be rotating while the old set is served.
func (s *keySource) run(ctx context.Context, failing bool) {
	for {
		wait := s.interval
		if failing {
			wait = min(wait, unknownKIDInterval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		failing = s.refresh(ctx, triggerPeriodic) != nil
	}
}

// refresh fetches the JWKS and puts it in use if it holds a usable key.
func (s *keySource) refresh(ctx context.Context, trigger string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshLocked(ctx, trigger)
}

// refreshForUnknownKID fetches the JWKS again unless a fetch was made or tried
// within unknownKIDInterval. Concurrent callers queue on the mutex and, the
// first fetch done, find it recent: one fetch serves them all.
func (s *keySource) refreshForUnknownKID() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lastAttempt.IsZero() && s.now().Sub(s.lastAttempt) < unknownKIDInterval {
		return
	}
	_ = s.refreshLocked(s.ctx, triggerUnknownKID)
}

func (s *keySource) refreshLocked(ctx context.Context, trigger string) error {
	s.lastAttempt = s.now()
	set, skipped, result, err := s.fetch(ctx)
	s.m.jwksRefreshes.WithLabelValues(trigger, result).Inc()
	if err != nil {
		s.lastErr.Store(&fetchError{err})
		kept := 0
		if old := s.keys.Load(); old != nil {
			kept = len(old.Keys)
		}
		s.log.Warn("JWKS refresh failed; keeping the last good key set", "url", s.logURL, "trigger", trigger, "keptKeys", kept, "err", err)
		return err
	}
	s.lastErr.Store(nil)
	s.keys.Store(set)
	s.m.jwksKeys.Set(float64(len(set.Keys)))
	s.m.jwksLastSuccess.Set(float64(s.now().UnixNano()) / 1e9)
	// Log the set when it changes, not every few minutes.
	kids := make([]string, len(set.Keys))
	for i, k := range set.Keys {
		kids[i] = k.KeyID
	}
	if summary := strings.Join(kids, ",") + "|" + strings.Join(skipped, ","); summary != s.lastLogged {
		s.lastLogged = summary
		s.log.Info("JWKS key set loaded", "url", s.logURL, "trigger", trigger, "kids", kids)
		for _, why := range skipped {
			s.log.Warn("JWKS key skipped", "url", s.logURL, "reason", why)
		}
	}
	return nil
}

// fetch gets and parses the JWKS, naming the result label for the metric.
func (s *keySource) fetch(ctx context.Context) (*jose.JSONWebKeySet, []string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, nil, refreshFetchError, fmt.Errorf("fetching JWKS: %w", err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		// The client's error quotes the URL with its query, which may sign
		// the request: logs and status get the redacted one.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			ue.URL = s.logURL
		}
		return nil, nil, refreshFetchError, fmt.Errorf("fetching JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, refreshFetchError, fmt.Errorf("fetching JWKS: status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, nil, refreshFetchError, fmt.Errorf("reading JWKS: %w", err)
	}
	if len(body) > maxJWKSBytes {
		return nil, nil, refreshInvalid, fmt.Errorf("JWKS larger than %d bytes", maxJWKSBytes)
	}
	set, skipped, err := parseJWKS(body)
	if err != nil {
		return nil, skipped, refreshInvalid, err
	}
	return set, skipped, refreshOK, nil
}

// parseJWKS keeps the public signing keys of a JWKS that jwt/v5 can verify
// with, and says why it skipped the others. Each key is decoded on its own
// rather than the set at once, because jose.JSONWebKeySet fails whole on one
// key of a type it does not know, and RFC 7517 §5 asks for such keys to be
// ignored. A set without any usable key is an error, so that a provider's
// glitch answering {"keys":[]} does not replace a good set.
func parseJWKS(data []byte) (*jose.JSONWebKeySet, []string, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, nil, fmt.Errorf("parsing JWKS: %w", err)
	}
	set := &jose.JSONWebKeySet{}
	var skipped []string
	for i, r := range raw.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(r); err != nil {
			skipped = append(skipped, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		if why := unusable(&k); why != "" {
			skipped = append(skipped, fmt.Sprintf("key %d (kid %q): %s", i, k.KeyID, why))
			continue
		}
		set.Keys = append(set.Keys, k)
	}
	if len(set.Keys) == 0 {
		return nil, skipped, errors.New("JWKS holds no usable signing key")
	}
	return set, skipped, nil
}

// unusable says why a key cannot verify tokens, or "".
func unusable(k *jose.JSONWebKey) string {
	if k.Use != "" && k.Use != "sig" {
		return fmt.Sprintf("use %q, not sig", k.Use)
	}
	switch key := k.Key.(type) {
	case *rsa.PublicKey:
		if key.N.BitLen() < minRSABits {
			return fmt.Sprintf("RSA key of %d bits, fewer than %d", key.N.BitLen(), minRSABits)
		}
	case *ecdsa.PublicKey:
		if ecdsaAlg(key.Curve) == "" {
			return "unsupported elliptic curve"
		}
	case ed25519.PublicKey:
	case []byte:
		// A shared secret published at a URL is no secret; accepting it
		// would let anyone sign tokens.
		return "symmetric (oct) key"
	case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
		// Whoever published the private key has compromised it: tokens it
		// signs prove nothing.
		return "private key published; refusing it"
	default:
		return fmt.Sprintf("unsupported key type %T", k.Key)
	}
	if k.Algorithm != "" && !slices.Contains(acceptedAlgs(), k.Algorithm) {
		return fmt.Sprintf("alg %q not accepted", k.Algorithm)
	}
	return ""
}

// acceptedAlgs are the JWS algorithms verified: asymmetric only, so that no
// token can be signed with a public key as an HMAC secret (algorithm
// confusion), and never "none".
func acceptedAlgs() []string {
	return []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
}

// ecdsaAlg is the one JWS algorithm for a curve (RFC 7518 §3.4).
func ecdsaAlg(c elliptic.Curve) string {
	switch c {
	case elliptic.P256():
		return "ES256"
	case elliptic.P384():
		return "ES384"
	case elliptic.P521():
		return "ES512"
	}
	return ""
}

// suits reports whether k may verify a token signed with alg: the key's type
// must fit the algorithm's family, and the key's own alg, when it names one,
// must be alg (RFC 8725 §3.1).
func suits(k *jose.JSONWebKey, alg string) bool {
	if k.Algorithm != "" && k.Algorithm != alg {
		return false
	}
	switch key := k.Key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return alg == ecdsaAlg(key.Curve)
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}
