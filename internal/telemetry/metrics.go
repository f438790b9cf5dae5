// Package telemetry defines kvgate's own Prometheus metrics, all named kvgate_*;
// docs/metrics.md describes each.
package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Latency buckets: from the sub-millisecond decisions to minutes-long generations.
var (
	latencyBuckets  = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}
	decisionBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1}
	// A scorer over a few candidates takes well under a microsecond.
	pluginBuckets = []float64{0.0000005, 0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.01}
)

// Gateway holds the gateway's metrics on their own registry.
type Gateway struct {
	Registry *prometheus.Registry

	Requests       *prometheus.CounterVec   // scheduler, model, endpoint, code
	Duration       *prometheus.HistogramVec // scheduler
	TTFT           *prometheus.HistogramVec // scheduler
	Decision       prometheus.Histogram
	Plugins        *prometheus.HistogramVec // extension_point, plugin
	PrefixMatch    *prometheus.HistogramVec // scheduler
	Tokens         *prometheus.CounterVec   // scheduler, kind
	Retries        *prometheus.CounterVec   // scheduler, reason
	Ejections      *prometheus.CounterVec   // scheduler, endpoint
	Shed           *prometheus.CounterVec   // scheduler, reason
	SLOMisses      *prometheus.CounterVec   // scheduler, action
	Probes         *prometheus.CounterVec   // scheduler
	StreamErrors   *prometheus.CounterVec   // scheduler
	InFlight       *prometheus.GaugeVec     // scheduler, endpoint
	Reloads        *prometheus.CounterVec   // result
	ConfigAccepted prometheus.Gauge
	Buffered       prometheus.Gauge
	BufferRefused  prometheus.Counter
}

// NewGateway creates and registers the gateway's metrics, with Go and process
// collectors.
func NewGateway() *Gateway {
	g := &Gateway{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_requests_total",
			Help: "Requests answered, by scheduler, requested model, serving endpoint and HTTP status.",
		}, []string{"scheduler", "model", "endpoint", "code"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_request_duration_seconds", Buckets: latencyBuckets,
			Help: "Time from a request's arrival at the gateway to its last byte sent to the client.",
		}, []string{"scheduler"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_time_to_first_token_seconds", Buckets: latencyBuckets,
			Help: "Time from a request's arrival to the first byte of the model server's response body (the first token when streaming).",
		}, []string{"scheduler"}),
		Decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvgate_decision_duration_seconds", Buckets: decisionBuckets,
			Help: "Time from a request's arrival to the choice of its endpoint: reading the body up to the model, admission and the picker.",
		}),
		Plugins: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_plugin_duration_seconds", Buckets: pluginBuckets,
			Help: "Time a decision spent in each filter and scorer of the GPU-aware picker, across all candidates, by extension point (Filter, Scorer) and plugin; one decision in 8 is timed.",
		}, []string{"extension_point", "plugin"}),
		PrefixMatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_prefix_match_ratio", Buckets: []float64{0, 0.1, 0.25, 0.5, 0.75, 0.9, 1},
			Help: "Share of a prompt's leading blocks the chosen endpoint was believed to hold, for requests of pools that score prefix affinity.",
		}, []string{"scheduler"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokens_total",
			Help: "Tokens from the usage the model servers reported, by scheduler and kind (prompt, completion).",
		}, []string{"scheduler", "kind"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_retries_total",
			Help: "Requests sent again to the next-best endpoint before any response byte reached the client, by reason (serve: connect, status, timeout, unhealthy; epp: fallback, when Envoy reports it served the request from a fallback of the list).",
		}, []string{"scheduler", "reason"}),
		Ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_endpoint_ejections_total",
			Help: "Times an endpoint was ejected by outlier detection (its answers failed spec.gateway.outlierDetection.consecutiveFailures times in a row).",
		}, []string{"scheduler", "endpoint"}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_shed_total",
			Help: "Requests refused by admission, by reason (no_endpoint: 503; saturated: 429 after queueTimeout; sheddable: 429 at once, objective priority below 0; slo: 429 at once, sheddable and no endpoint predicted to meet its ttftSLO).",
		}, []string{"scheduler", "reason"}),
		SLOMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_ttft_slo_unmet_total",
			Help: "Requests with a ttftSLO that no endpoint was predicted to meet, by action (shed: refused, the request being sheddable; routed: sent to the best endpoint).",
		}, []string{"scheduler", "action"}),
		Probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_probes_total",
			Help: "Requests sent to an endpoint that got none for 30 s while its pool answered, to measure its speed again.",
		}, []string{"scheduler"}),
		StreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_stream_errors_total",
			Help: "Responses that failed after bytes reached the client and were ended with an error event.",
		}, []string{"scheduler"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_endpoint_in_flight",
			Help: "Requests in flight from this gateway to each endpoint.",
		}, []string{"scheduler", "endpoint"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
		ConfigAccepted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_config_last_reload_successful",
			Help: "1 when the last configuration read was accepted, 0 when it was rejected and the previous one still serves.",
		}),
		Buffered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_buffered_bytes",
			Help: "Request body bytes held in memory now: the heads read to find the model and the bytes kept to replay bodies on a retry (bounded by spec.gateway.maxBufferedBytes).",
		}),
		BufferRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_buffer_refused_total",
			Help: "Requests refused with 503 because holding their body's head would have taken the bytes held past spec.gateway.maxBufferedBytes.",
		}),
	}
	g.Registry.MustRegister(g.Requests, g.Duration, g.TTFT, g.Decision, g.Plugins, g.PrefixMatch, g.Tokens, g.Retries, g.Ejections, g.Shed, g.SLOMisses, g.Probes, g.StreamErrors,
		g.InFlight, g.Reloads, g.ConfigAccepted, g.Buffered, g.BufferRefused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return g
}

// PluginTimer returns what records one decision's time in a picker plugin
// (schedule.Timer): the series is looked up once, here, so that a decision
// only adds to it.
func (g *Gateway) PluginTimer(point, plugin string) func(time.Duration) {
	o := g.Plugins.WithLabelValues(point, plugin)
	return func(d time.Duration) { o.Observe(d.Seconds()) }
}

// ExtProc holds the metrics of the Envoy ext_proc data plane (`kvgate epp`); the
// requests themselves are counted in the Gateway metrics, as `serve` counts them.
type ExtProc struct {
	Streams      *prometheus.CounterVec // outcome
	DuplicateEOS *prometheus.CounterVec // direction
	HeldBytes    prometheus.Histogram
	BodyEndDelay prometheus.Histogram
	BBR          *prometheus.CounterVec // result
}

// NewExtProc creates the ext_proc metrics and registers them on reg.
func NewExtProc(reg prometheus.Registerer) *ExtProc {
	m := &ExtProc{
		Streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_streams_total",
			Help: "ext_proc streams (one per HTTP request) by outcome: routed (a pick was returned), refused (an immediate response), aborted (the proxy or client went away before the request was routed), protocol_error (a message out of the protocol's order), observed (observability mode, nothing answered).",
		}, []string{"outcome"}),
		DuplicateEOS: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_duplicate_eos_total",
			Help: "Body messages received after their direction's end of stream (Envoy issue 46237: the last chunk of a large body sent twice), by direction; they are dropped.",
		}, []string{"direction"}),
		HeldBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_held_bytes",
			Help:    "Request body bytes held before the pick: what had to be read to find the model and the prompt's head. Everything after streams through unheld.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10),
		}),
		BodyEndDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_body_end_delay_seconds",
			Help:    "Time from the request body's last chunk reaching the processor to the processor sending it back: what it adds to the request path (a decision that needed the whole body included).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
		}),
		BBR: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_bbr_requests_total",
			Help: "Requests seen by the body-based router (`kvgate epp --bbr`) by result: model (model header set), adapter (an adapter, base model header set too), no_model (no model in the body; passed through unchanged), unreadable (a body that is not a JSON object, or a model name with control characters or over 512 bytes; passed through unchanged).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.Streams, m.DuplicateEOS, m.HeldBytes, m.BodyEndDelay, m.BBR)
	return m
}
