package auth

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's Prometheus metrics. When Options.Registerer is
// nil they are counted but not exported.
type metrics struct {
	// kvgate_auth_requests_total{method,result}: requests Authenticate
	// decided. method is the kind of credentials presented (api_key, jwt,
	// anonymous, or none when a request without credentials was refused);
	// result is ok or the Reason of the refusal (missing, malformed,
	// unknown_key, unsupported_alg, unknown_kid, bad_signature, expired,
	// not_yet_valid, wrong_issuer, wrong_audience, missing_claim, no_tenant,
	// invalid, claim_mismatch, throttled). Requests to the Middleware's open
	// paths are not counted.
	requests *prometheus.CounterVec
	// kvgate_auth_jwks_refreshes_total{trigger,result}: fetches of the JWKS.
	// trigger is startup, periodic or unknown_kid (a token named a key the
	// cached set lacks; at most one such fetch per 30 s); result is ok,
	// fetch_error (network, timeout, non-200 status) or invalid (not a JWKS, or
	// no usable signing key in it). On any failure the last good set stays.
	jwksRefreshes *prometheus.CounterVec
	// kvgate_auth_jwks_keys: usable signing keys in the JWKS in use; 0 until
	// the first successful fetch.
	jwksKeys prometheus.Gauge
	// kvgate_auth_jwks_last_success_timestamp_seconds: Unix time of the last
	// successful JWKS fetch; alert when it lags far behind the refresh
	// interval, as the keys in use may be stale.
	jwksLastSuccess prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_auth_requests_total",
			Help: "Requests authenticated, by credential kind (api_key, jwt, anonymous, none) and result (ok or the reason of the 401).",
		}, []string{"method", "result"}),
		jwksRefreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_auth_jwks_refreshes_total",
			Help: "JWKS fetches, by trigger (startup, periodic, unknown_kid) and result (ok, fetch_error, invalid); a failed fetch keeps the last good key set.",
		}, []string{"trigger", "result"}),
		jwksKeys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_auth_jwks_keys",
			Help: "Usable signing keys in the JWKS in use.",
		}),
		jwksLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_auth_jwks_last_success_timestamp_seconds",
			Help: "Unix time of the last successful JWKS fetch.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.jwksRefreshes, err = register(reg, m.jwksRefreshes); err != nil {
		return nil, err
	}
	if m.jwksKeys, err = register(reg, m.jwksKeys); err != nil {
		return nil, err
	}
	if m.jwksLastSuccess, err = register(reg, m.jwksLastSuccess); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under its
// name: a configuration reload builds a new Authenticator on the same
// registry, and its counts must continue the old ones.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("registering auth metrics: %w", err)
}

// Labels of kvgate_auth_jwks_refreshes_total.
const (
	triggerStartup    = "startup"
	triggerPeriodic   = "periodic"
	triggerUnknownKID = "unknown_kid"

	refreshOK         = "ok"
	refreshFetchError = "fetch_error"
	refreshInvalid    = "invalid"
)
