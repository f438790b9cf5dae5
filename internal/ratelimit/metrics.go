package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Label values of kvgate_ratelimit_decisions_total.
const (
	resultAllowed     = "allowed"
	resultDenied      = "denied"      // 429
	resultUnavailable = "unavailable" // fail-closed with Redis down: 503

	dimNone     = "none"
	dimRequests = "requests"
	dimTokens   = "tokens"
	dimBoth     = "both"
)

// Metrics are the limiter's Prometheus metrics, all named kvgate_ratelimit_*.
type Metrics struct {
	Decisions     *prometheus.CounterVec // result, dimension
	Degraded      *prometheus.CounterVec // result
	RedisErrors   *prometheus.CounterVec // op
	RedisUp       prometheus.Gauge
	RedisDuration *prometheus.HistogramVec // op
	RedisWait     prometheus.Gauge
	Reconciled    *prometheus.CounterVec // direction
}

// NewMetrics creates the metrics and registers them on reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_ratelimit_decisions_total",
			Help: "Rate-limit decisions by result (allowed; denied: 429; unavailable: Redis down and fail-closed, 503) and dimension (for denials, the limit that refused: requests, tokens or both; none otherwise). Includes the degraded ones.",
		}, []string{"result", "dimension"}),
		Degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_ratelimit_degraded_decisions_total",
			Help: "Decisions taken by this replica's local limiter because Redis was unavailable (fail-open), by result (allowed, denied). Each replica then enforces the limit on its own.",
		}, []string{"result"}),
		RedisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_ratelimit_redis_errors_total",
			Help: "Redis calls that failed or were not answered within the wait (kvgate_ratelimit_redis_wait_seconds), by operation (reserve, adjust).",
		}, []string{"op"}),
		RedisUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_ratelimit_redis_up",
			Help: "1 while the last call to Redis succeeded, 0 while decisions fall back to the fail mode.",
		}),
		RedisDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_ratelimit_redis_duration_seconds",
			Help:    "Time of one rate-limit script call to Redis until its answer, by operation (reserve, adjust), failures and answers that came after the request stopped waiting included.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}, []string{"op"}),
		RedisWait: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_ratelimit_redis_wait_seconds",
			Help: "How long a request now waits for Redis's decision before its fail mode decides: rateLimit.timeout, longer while Redis answers slowly (at most 10 × timeout).",
		}),
		Reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_ratelimit_reconciled_tokens_total",
			Help: "Tokens moved by reconciling reservations with the real usage, by direction: refunded (used fewer than reserved, or cancelled) or charged (used more).",
		}, []string{"direction"}),
	}
	if reg != nil {
		reg.MustRegister(m.Decisions, m.Degraded, m.RedisErrors, m.RedisUp, m.RedisDuration, m.RedisWait, m.Reconciled)
	}
	return m
}

// decided counts one decision.
func (m *Metrics) decided(result, dimension string, degraded bool) {
	m.Decisions.WithLabelValues(result, dimension).Inc()
	if degraded {
		m.Degraded.WithLabelValues(result).Inc()
	}
}

// deniedDimension names the dimensions of a decision's denied bits.
func deniedDimension(denied int64) string {
	switch denied {
	case 0:
		return dimNone
	case 1:
		return dimRequests
	case 2:
		return dimTokens
	}
	return dimBoth
}
