package peers

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// outcomes label kvgate_replica_messages_total.
var outcomes = []string{"sent", "received", "send_failed", "foreign", "malformed", "oversized", "duplicate_name", "too_many_peers"}

type metrics struct {
	messages    *prometheus.CounterVec
	up          prometheus.Gauge
	peers       prometheus.Gauge
	propagation prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_replica_messages_total",
			Help: "Shared-state stream entries by outcome: sent, received from a peer (duplicate_name also: from another process with this replica's name), send_failed (Redis unavailable), and dropped as foreign (another cluster's identity), malformed, oversized, or too_many_peers (past 256)."}, []string{"outcome"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_replica_shared_state_up",
			Help: "1 while the last call to the shared-state Redis succeeded; 0 while this replica routes on its own state alone."}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_replica_peers",
			Help: "Other live replicas this replica shares routing state with."}),
		propagation: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_replica_propagation_seconds",
			Help:    "Time from a peer sending an entry to this replica applying it, by the two replicas' clocks.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}}),
	}
	for _, o := range outcomes {
		m.messages.WithLabelValues(o)
	}
	if reg != nil {
		m.messages = registered(reg, m.messages)
		m.up = registered(reg, m.up)
		m.peers = registered(reg, m.peers)
		m.propagation = registered(reg, m.propagation)
	}
	return m
}

// registered registers c, or returns the collector registered before it
// under its name (a mesh that failed to start reported itself down).
func registered[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if prev, ok := are.ExistingCollector.(T); ok {
				return prev
			}
		}
		panic(err)
	}
	return c
}

// Down reports, on reg, shared state configured but not started (its
// configuration could not be used): kvgate_replica_shared_state_up 0.
func Down(reg prometheus.Registerer) { newMetrics(reg).up.Set(0) }

// counts reads the message counters, for /debug/replicas.
func (m *metrics) counts() map[string]float64 {
	out := make(map[string]float64, len(outcomes))
	for _, o := range outcomes {
		c, err := m.messages.GetMetricWithLabelValues(o)
		if err != nil {
			continue
		}
		out[o] = counterValue(c)
	}
	return out
}

func counterValue(c prometheus.Counter) float64 {
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		return 0
	}
	return pb.GetCounter().GetValue()
}
