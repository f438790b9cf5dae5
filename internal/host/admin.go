package host

import (
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/openai"
)

// AdminHandler serves /metrics, /healthz, /readyz, /summary (the global router's
// heartbeat), /debug/config, /debug/fleet, /debug/replicas, /debug/pprof (when
// enabled) and the fleet page (/ui/, ui.go). Health and /summary answer
// everyone; /debug/* only whom AdminOptions.Auth admits, under a Host a
// browser cannot be tricked into (adminauth.go).
func (h *Host) AdminHandler() http.Handler {
	mux := h.admin.Mux(AdminPages{
		Metrics: promhttp.HandlerFor(h.Metrics().Registry, promhttp.HandlerOpts{}),
		Open: map[string]http.HandlerFunc{
			"GET /healthz": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) },
			"GET /readyz":  h.serveReadyz,
			"GET /summary": func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Cache-Control", "no-store")
				openai.WriteJSON(w, h.core.Summary())
			},
		},
		Protected: map[string]http.HandlerFunc{
			"GET /debug/config":   h.serveDebugConfig,
			"GET /debug/fleet":    h.serveDebugFleet,
			"GET /debug/replicas": h.serveDebugReplicas,
		},
	})
	h.routeUI(mux, h.admin)
	return mux
}

// AdminPages are what an admin listener serves: kvgate serve's and kvgate
// global's differ in these only.
type AdminPages struct {
	Metrics   http.Handler                // /metrics
	Open      map[string]http.HandlerFunc // health and heartbeats: everyone, by pattern
	Protected map[string]http.HandlerFunc // configuration, fleet: whom the gate admits, by pattern
}

// Mux serves p behind the gate: open pages to everyone, /metrics to everyone
// unless AdminOptions.Metrics puts it behind the authentication, protected
// pages and Go's profiler (when AdminOptions.Pprof) to whom the
// authentication admits, under a Host a browser cannot be tricked into.
func (g *AdminGate) Mux(p AdminPages) *http.ServeMux {
	mux := http.NewServeMux()
	metrics := p.Metrics
	if g.opts.Metrics && g.opts.Auth != AdminAuthNone {
		metrics = g.authenticated(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	for pattern, f := range p.Open {
		mux.Handle(pattern, f)
	}
	protect := func(pattern string, f http.HandlerFunc) { mux.Handle(pattern, g.protected(f)) }
	for pattern, f := range p.Protected {
		protect(pattern, f)
	}
	if g.opts.Pprof {
		// Go's profiler: CPU profiles and execution traces on demand, so
		// only when asked for.
		protect("GET /debug/pprof/", pprof.Index)
		protect("GET /debug/pprof/profile", pprof.Profile)
		protect("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func (h *Host) serveReadyz(w http.ResponseWriter, r *http.Request) {
	switch {
	case h.core.Draining():
		http.Error(w, "draining", http.StatusServiceUnavailable)
	case !h.core.Configured() && !h.opts.ReadyWithoutConfig:
		msg := "no configuration"
		if _, _, err := h.core.ConfigStatus(); err != nil {
			msg += ": the last one was rejected: " + err.Error()
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
	case h.awaitingCertificate() != "":
		http.Error(w, h.awaitingCertificate(), http.StatusServiceUnavailable)
	case len(h.core.Unready()) > 0 && r.URL.Query().Get("endpoints") == "all":
		// Opt-in: a load balancer in front of one model's replicas may
		// prefer to send nothing to one that cannot serve it.
		http.Error(w, "no ready endpoint for scheduler "+strings.Join(h.core.Unready(), ", "), http.StatusServiceUnavailable)
	case len(h.core.Unready()) > 0:
		// Every replica sees the same pods: failing readiness here would
		// take every replica, and every other model, out of the Service
		// when one pool is empty. Requests for that model get 503.
		_, _ = w.Write([]byte("ok; no ready endpoint for scheduler " + strings.Join(h.core.Unready(), ", ") + "\n"))
	default:
		_, _ = w.Write([]byte("ok\n"))
	}
}

// serveDebugConfig shows the configuration serving now, without its secrets,
// and the outcome of the last attempt to load one.
func (h *Host) serveDebugConfig(w http.ResponseWriter, _ *http.Request) {
	active, when, lastErr := h.core.ConfigStatus()
	out := map[string]any{"lastReload": when.UTC().Format(time.RFC3339Nano), "lastReloadAccepted": lastErr == nil}
	if lastErr != nil {
		out["lastReloadError"] = lastErr.Error()
	}
	if active != nil {
		y, err := config.Marshal(config.Redacted(active))
		if err == nil {
			out["active"] = string(y)
		}
	}
	openai.WriteJSON(w, out)
}

func (h *Host) serveDebugFleet(w http.ResponseWriter, _ *http.Request) {
	openai.WriteJSON(w, h.core.FleetView())
}
