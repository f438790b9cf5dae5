package route

import (
	"math"
	"slices"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/latency"
)

// SchedulerView is one scheduler in /debug/fleet.
type SchedulerView struct {
	Scheduler string         `json:"scheduler"`
	Model     string         `json:"model"`
	Adapters  []string       `json:"adapters,omitempty"`
	Picker    string         `json:"picker"`
	Endpoints []EndpointView `json:"endpoints"`
}

type EndpointView struct {
	Address  string `json:"address"`
	InFlight int64  `json:"inFlight"`
	// PeerInFlight is what the other replicas last reported in flight there.
	PeerInFlight int64 `json:"peerInFlight,omitempty"`
	// From the endpoint's scraped metrics, with this gateway's dispatches since the
	// last scrape folded into waiting and KV usage.
	Scraped bool    `json:"scraped"`
	Healthy bool    `json:"healthy"`
	Stale   bool    `json:"stale"`
	AgeMs   float64 `json:"ageMs"`
	Dialect string  `json:"dialect,omitempty"`
	Waiting float64 `json:"waiting"`
	Running float64 `json:"running"`
	KVUsage float64 `json:"kvUsage"`
	// Estimates from this gateway's own dispatches.
	Pending       int    `json:"pending"`       // dispatched since the last scrape
	PrefillTokens int    `json:"prefillTokens"` // prompt tokens awaiting their first token
	PrefixBlocks  int    `json:"prefixBlocks"`  // prompt blocks the prefix index holds for it
	ScrapeErrors  uint64 `json:"scrapeErrors"`
	// Outlier detection: failed answers in a row, and the time left of an
	// ejection (the endpoint is picked only when nothing else is).
	ConsecutiveFailures int     `json:"consecutiveFailures"`
	EjectedForMs        float64 `json:"ejectedForMs,omitempty"`
	ErrorRate           float64 `json:"errorRate"` // recent failure share, 0..1
	LastError           string  `json:"lastError,omitempty"`
	// Publishes lists the signals the last scrape carried (queue, running,
	// kvUsage, kvBlocks, lora); a scorer reading one that some endpoint of
	// the pool lacks sits the pool's decisions out.
	Publishes []string `json:"publishes,omitempty"`
	// Speed is what predictedLatency learned of the endpoint's answers
	// (borrowed: its pool's median, while it has too few of its own).
	Speed latency.Speed `json:"speed"`
	// LastMinute is what this gateway saw of its requests over the last minute.
	LastMinute EndpointMinute `json:"lastMinute"`
}

// FleetView is every scheduler's endpoints as the picker sees them now.
func (g *Router) FleetView() []SchedulerView {
	out := []SchedulerView{}
	if rt := g.routes.Load(); rt != nil {
		for _, p := range rt.schedulers {
			v := SchedulerView{Scheduler: p.name, Model: p.spec.ModelName, Adapters: slices.Clone(p.spec.LoRAAdapters), Picker: p.spec.PickerName(), Endpoints: []EndpointView{}}
			for _, e := range p.endpoints {
				ev := EndpointView{Address: e.addr, InFlight: e.inFlight.Load(), PeerInFlight: e.peers.Load()}
				if snaps := g.fleet.Snapshot([]string{e.addr}); len(snaps) == 1 {
					sn := snaps[0]
					ev.Scraped, ev.Healthy, ev.Stale, ev.AgeMs = sn.Scraped, sn.Healthy, sn.Stale, float64(sn.Age.Microseconds())/1000
					ev.Dialect, ev.Waiting, ev.Running, ev.KVUsage, ev.LastError = string(sn.Dialect), sn.Waiting, sn.Running, sn.KVUsage, sn.LastError
					ev.Pending, ev.PrefillTokens, ev.ScrapeErrors = sn.Pending, sn.PrefillTokens, sn.ScrapeErrors
					if sn.Scraped {
						ev.Publishes = sn.Published().Names()
					}
				}
				ev.PrefixBlocks = g.prefix.EntriesOf(e.addr)
				ev.Speed = e.speed.Speed(p.poolSpeed())
				ev.ConsecutiveFailures = int(e.out.failures.Load())
				now := g.now()
				ev.LastMinute = e.minuteView(now)
				ev.ErrorRate = math.Round(e.errorRate(now)*1000) / 1000
				if e.ejected(now) {
					ev.EjectedForMs = float64(time.Unix(0, e.out.until.Load()).Sub(now).Microseconds()) / 1000
				}
				v.Endpoints = append(v.Endpoints, ev)
			}
			out = append(out, v)
		}
	}
	return out
}

// Draining says whether Drain was called.
func (g *Router) Draining() bool { return g.draining.Load() }

// Configured says whether a configuration was applied.
func (g *Router) Configured() bool { return g.routes.Load() != nil }

// ConfigStatus is the configuration serving now (nil before the first) and the
// time and error of the last attempt to load one.
func (g *Router) ConfigStatus() (active *v1alpha1.InferenceGatewayConfig, lastReload time.Time, lastErr error) {
	g.mu.Lock()
	lastErr, lastReload = g.lastErr, g.lastReload
	g.mu.Unlock()
	if rt := g.routes.Load(); rt != nil {
		active = rt.cfg
	}
	return active, lastReload, lastErr
}

// Snapshot is the fleet's view of addrs now, as the picker reads it.
func (g *Router) Snapshot(addrs []string) []fleet.Snapshot { return g.fleet.Snapshot(addrs) }

// Waiting counts the requests waiting for a free endpoint slot.
func (g *Router) Waiting() int { return int(g.waiting.n.Load()) }

// Observe feeds an endpoint's metrics read elsewhere (the virtual-time
// benchmark's engines), for a fleet configured External.
func (g *Router) Observe(addr string, m engine.Metrics, d engine.Dialect, started time.Time) {
	g.fleet.Observe(addr, m, d, started)
}
