package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/openai"
)

// serveModels lists every model and adapter the gateway routes, in the OpenAI
// list format.
func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "use GET")
		return
	}
	var data []openai.Model
	if rt := g.routes.Load(); rt != nil {
		created := rt.cfg.CreationTimestamp.Unix()
		for _, p := range rt.pools {
			data = append(data, openai.Model{ID: p.spec.ModelName, Object: "model", Created: created, OwnedBy: "kvgate"})
			for _, a := range p.spec.LoRAAdapters {
				data = append(data, openai.Model{ID: a, Object: "model", Created: created, OwnedBy: "kvgate", Parent: &p.spec.ModelName})
			}
		}
	}
	writeJSON(w, openai.Models(data))
}

// AdminHandler serves /metrics, /healthz, /readyz, /summary (the global router's
// heartbeat), /debug/config, /debug/fleet and /debug/pprof.
func (g *Gateway) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case g.draining.Load():
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case g.routes.Load() == nil && !g.opts.ReadyWithoutConfig:
			http.Error(w, "no configuration", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	mux.HandleFunc("GET /debug/config", g.serveDebugConfig)
	mux.HandleFunc("GET /summary", g.serveSummary)
	// Go's profiler, on the admin listener only.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/fleet", g.serveDebugFleet)
	return mux
}

// serveDebugConfig shows the configuration serving now and the outcome of the
// last attempt to load one.
func (g *Gateway) serveDebugConfig(w http.ResponseWriter, _ *http.Request) {
	g.mu.Lock()
	lastErr, when := g.lastErr, g.lastReload
	g.mu.Unlock()
	out := map[string]any{"lastReload": when.UTC().Format(time.RFC3339Nano), "lastReloadAccepted": lastErr == nil}
	if lastErr != nil {
		out["lastReloadError"] = lastErr.Error()
	}
	if rt := g.routes.Load(); rt != nil {
		y, err := config.Marshal(rt.cfg)
		if err == nil {
			out["active"] = string(y)
		}
	}
	writeJSON(w, out)
}

// fleetView is one scheduler in /debug/fleet.
type fleetView struct {
	Scheduler string         `json:"scheduler"`
	Model     string         `json:"model"`
	Adapters  []string       `json:"adapters,omitempty"`
	Picker    string         `json:"picker"`
	Endpoints []endpointView `json:"endpoints"`
}

type endpointView struct {
	Address  string `json:"address"`
	InFlight int64  `json:"inFlight"`
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
	LastError     string `json:"lastError,omitempty"`
}

func (g *Gateway) serveDebugFleet(w http.ResponseWriter, _ *http.Request) {
	out := []fleetView{}
	if rt := g.routes.Load(); rt != nil {
		for _, p := range rt.pools {
			v := fleetView{Scheduler: p.name, Model: p.spec.ModelName, Adapters: slices.Clone(p.spec.LoRAAdapters), Picker: p.spec.PickerName(), Endpoints: []endpointView{}}
			for _, e := range p.endpoints {
				ev := endpointView{Address: e.addr, InFlight: e.inFlight.Load()}
				if snaps := g.fleet.Snapshot([]string{e.addr}); len(snaps) == 1 {
					sn := snaps[0]
					ev.Scraped, ev.Healthy, ev.Stale, ev.AgeMs = sn.Scraped, sn.Healthy, sn.Stale, float64(sn.Age.Microseconds())/1000
					ev.Dialect, ev.Waiting, ev.Running, ev.KVUsage, ev.LastError = string(sn.Dialect), sn.Waiting, sn.Running, sn.KVUsage, sn.LastError
					ev.Pending, ev.PrefillTokens, ev.ScrapeErrors = sn.Pending, sn.PrefillTokens, sn.ScrapeErrors
				}
				ev.PrefixBlocks = g.prefix.EntriesOf(e.addr)
				v.Endpoints = append(v.Endpoints, ev)
			}
			out = append(out, v)
		}
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, openai.TypeServer, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
