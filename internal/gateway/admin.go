package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/openai"
)

// serveModels lists every model and adapter the gateway routes, in the OpenAI
// list format, or (GET /v1/models/{id}, the SDKs' models.retrieve) one of
// them; a model id may hold slashes.
func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request, who *auth.Identity) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "use GET")
		return
	}
	id, one := strings.CutPrefix(r.URL.Path, "/v1/models/")
	if !one {
		writeJSON(w, openai.Models(g.Models(who)))
		return
	}
	for _, m := range g.Models(who) {
		if m.ID == id {
			writeJSON(w, m)
			return
		}
	}
	openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("the model %q does not exist", id))
}

// AdminHandler serves /metrics, /healthz, /readyz, /summary (the global router's
// heartbeat), /debug/config, /debug/fleet, /debug/replicas, /debug/pprof and the
// fleet page (/ui/, ui.go).
func (g *Gateway) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.Metrics().Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case g.Draining():
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case !g.Configured() && !g.opts.ReadyWithoutConfig:
			msg := "no configuration"
			if _, _, err := g.ConfigStatus(); err != nil {
				msg += ": the last one was rejected: " + err.Error()
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
		case g.awaitingCertificate() != "":
			http.Error(w, g.awaitingCertificate(), http.StatusServiceUnavailable)
		case len(g.Unready()) > 0 && r.URL.Query().Get("endpoints") == "all":
			// Opt-in: a load balancer in front of one model's replicas may
			// prefer to send nothing to one that cannot serve it.
			http.Error(w, "no ready endpoint for scheduler "+strings.Join(g.Unready(), ", "), http.StatusServiceUnavailable)
		case len(g.Unready()) > 0:
			// Every replica sees the same pods: failing readiness here would
			// take every replica, and every other model, out of the Service
			// when one pool is empty. Requests for that model get 503.
			_, _ = w.Write([]byte("ok; no ready endpoint for scheduler " + strings.Join(g.Unready(), ", ") + "\n"))
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	mux.HandleFunc("GET /debug/config", g.serveDebugConfig)
	mux.HandleFunc("GET /summary", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, g.Summary())
	})
	// Go's profiler, on the admin listener only.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/fleet", g.serveDebugFleet)
	mux.HandleFunc("GET /debug/replicas", g.serveDebugReplicas)
	g.routeUI(mux)
	return mux
}

// serveDebugConfig shows the configuration serving now and the outcome of the
// last attempt to load one.
func (g *Gateway) serveDebugConfig(w http.ResponseWriter, _ *http.Request) {
	active, when, lastErr := g.ConfigStatus()
	out := map[string]any{"lastReload": when.UTC().Format(time.RFC3339Nano), "lastReloadAccepted": lastErr == nil}
	if lastErr != nil {
		out["lastReloadError"] = lastErr.Error()
	}
	if active != nil {
		y, err := config.Marshal(active)
		if err == nil {
			out["active"] = string(y)
		}
	}
	writeJSON(w, out)
}

func (g *Gateway) serveDebugFleet(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, g.FleetView())
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
