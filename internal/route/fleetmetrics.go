package route

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/prefix"
)

// fleetCollector exports the fleet's view of every endpoint at scrape time.
type fleetCollector struct {
	g                               *Router
	healthy, stale, age, queue, kvu *prometheus.Desc
	prefixBlocks, prefixBytes       *prometheus.Desc
	scrapeErrors, prefill, ejected  *prometheus.Desc
}

func newFleetCollector(g *Router) *fleetCollector {
	labels := []string{"scheduler", "endpoint"}
	return &fleetCollector{
		g:       g,
		healthy: prometheus.NewDesc("kvgate_endpoint_healthy", "1 when the endpoint's last scrapes succeeded, 0 after consecutive failures.", labels, nil),
		stale:   prometheus.NewDesc("kvgate_endpoint_stale", "1 when the endpoint's metrics are older than the staleness bound (2 s) or were never read.", labels, nil),
		age:     prometheus.NewDesc("kvgate_endpoint_metrics_age_seconds", "Age of the endpoint's last successful scrape.", labels, nil),
		queue:   prometheus.NewDesc("kvgate_endpoint_waiting", "Requests queued at the endpoint as the picker sees them: its last scrape plus this gateway's dispatches since.", labels, nil),
		kvu:     prometheus.NewDesc("kvgate_endpoint_kv_cache_usage", "KV-cache usage of the endpoint as the picker sees it, 0..1.", labels, nil),
		prefixBlocks: prometheus.NewDesc("kvgate_prefix_index_blocks",
			"Prompt blocks the prefix index remembers across endpoints (each endpoint bounded by its KV-cache size).", nil, nil),
		prefixBytes: prometheus.NewDesc("kvgate_prefix_index_bytes", "Estimated heap size of the prefix index.", nil, nil),
		scrapeErrors: prometheus.NewDesc("kvgate_endpoint_scrape_errors_total",
			"Failed scrapes of the endpoint's metrics since it joined the configuration.", labels, nil),
		ejected: prometheus.NewDesc("kvgate_endpoint_ejected", "1 while outlier detection has the endpoint ejected (picked only when nothing else is).", labels, nil),
		prefill: prometheus.NewDesc("kvgate_endpoint_prefill_tokens",
			"Prompt tokens this gateway sent to the endpoint that await their first token.", labels, nil),
	}
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.healthy, c.stale, c.age, c.queue, c.kvu, c.prefixBlocks, c.prefixBytes, c.scrapeErrors, c.prefill, c.ejected} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.g.prefix.Entries()
	ch <- prometheus.MustNewConstMetric(c.prefixBlocks, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.prefixBytes, prometheus.GaugeValue, float64(n*prefix.EntryBytes))
	rt := c.g.routes.Load()
	if rt == nil {
		return
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, p := range rt.schedulers {
		addrs := make([]string, len(p.endpoints))
		for i, e := range p.endpoints {
			addrs[i] = e.addr
		}
		now := c.g.now()
		for i, s := range c.g.fleet.Snapshot(addrs) {
			ch <- prometheus.MustNewConstMetric(c.ejected, prometheus.GaugeValue, b2f(p.endpoints[i].ejected(now)), p.name, s.Address)
			ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b2f(s.Healthy), p.name, s.Address)
			ch <- prometheus.MustNewConstMetric(c.stale, prometheus.GaugeValue, b2f(s.Stale), p.name, s.Address)
			ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.CounterValue, float64(s.ScrapeErrors), p.name, s.Address)
			ch <- prometheus.MustNewConstMetric(c.prefill, prometheus.GaugeValue, float64(s.PrefillTokens), p.name, s.Address)
			if s.Scraped {
				ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, s.Age.Seconds(), p.name, s.Address)
				ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, s.Waiting, p.name, s.Address)
				ch <- prometheus.MustNewConstMetric(c.kvu, prometheus.GaugeValue, s.KVUsage, p.name, s.Address)
			}
		}
	}
}
