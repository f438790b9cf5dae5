package global

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the global router's, all named kvgate_global_*; docs/metrics.md
// describes each.
type Metrics struct {
	Registry      *prometheus.Registry
	Requests      *prometheus.CounterVec   // member, model, code
	Duration      *prometheus.HistogramVec // member
	TTFT          *prometheus.HistogramVec // member
	Tokens        *prometheus.CounterVec   // member, kind
	Cost          *prometheus.CounterVec   // member
	Failovers     *prometheus.CounterVec   // from, to
	Spills        *prometheus.CounterVec   // model, from (the cheapest), to
	MemberHealthy *prometheus.GaugeVec     // member
	MemberRamp    *prometheus.GaugeVec     // member
	Reloads       *prometheus.CounterVec   // result
	ConfigOK      prometheus.Gauge
}

var latency = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}

// NewMetrics creates the router's metrics on their own registry, with Go and
// process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_requests_total",
			Help: "Requests answered, by member (empty when refused here), model and status (499: the client went away; stream_error: the member's stream broke after bytes reached the client)."},
			[]string{"member", "model", "code"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_global_request_duration_seconds", Buckets: latency,
			Help: "Time from a request's arrival to its last byte, by member."}, []string{"member"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_global_time_to_first_token_seconds", Buckets: latency,
			Help: "Time from a request's arrival to the first byte of its member's response body, by member."}, []string{"member"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_tokens_total",
			Help: "Tokens served, by member and kind (prompt, completion), from the usage members report (else one per streamed event)."},
			[]string{"member", "kind"}),
		Cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_cost_total",
			Help: "What the served tokens cost at each member's configured price per million tokens, in the configuration's currency."},
			[]string{"member"}),
		Failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_failovers_total",
			Help: "Requests sent to another member after one failed before answering (connection error or 5xx), by the member that failed and the next."},
			[]string{"from", "to"}),
		Spills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_spills_total",
			Help: "Requests first sent to a dearer member than the cheapest healthy one (its SLO at risk, its ramp, or capacity weights), by model, cheapest member and chosen member."},
			[]string{"model", "from", "to"}),
		MemberHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_global_member_healthy",
			Help: "1 when the member's heartbeat is fresh, it is not draining and not ejected after failed requests."}, []string{"member"}),
		MemberRamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_global_member_ramp",
			Help: "The share of its full traffic a returning member may take, rising from 0.1 to 1 over routing.rampUp."}, []string{"member"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_global_config_reloads_total",
			Help: "Attempts to load a changed configuration file, by result (success, failure: the previous configuration keeps serving)."}, []string{"result"}),
		ConfigOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_global_config_last_reload_successful",
			Help: "1 when the last attempt to load the configuration file succeeded."}),
	}
	// Both results exist from the start, so that the first failure is an
	// increase.
	m.Reloads.WithLabelValues("success")
	m.Reloads.WithLabelValues("failure")
	m.Registry.MustRegister(m.Requests, m.Duration, m.TTFT, m.Tokens, m.Cost, m.Failovers, m.Spills, m.MemberHealthy, m.MemberRamp, m.Reloads, m.ConfigOK,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
