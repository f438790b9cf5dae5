package global

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/ratelimit"
	"github.com/kvgate/kvgate/internal/serving"
)

// ServerOptions configure Run.
type ServerOptions struct {
	Config       *Config
	Listen       string // OpenAI API (default :8080)
	AdminListen  string // metrics, health, /debug/members (default :9090)
	DrainTimeout time.Duration
	Router       Options
	// Ready, when set, receives the bound addresses once both listeners accept.
	Ready chan<- [2]string
}

// Run serves the router until ctx ends, then drains.
func Run(ctx context.Context, o ServerOptions) error {
	log := o.Router.Logger
	if log == nil {
		log = slog.Default()
	}
	o.Router.Logger = log
	// Heartbeats outlive ctx: while the API drains, requests waiting for a
	// member still need to know which members are alive.
	hbCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	closeDeps, err := Dependencies(hbCtx, o.Config, &o.Router)
	if err != nil {
		return err
	}
	defer closeDeps()
	r := New(o.Config, o.Router)
	r.Start(hbCtx)
	apiLn, adminLn, err := serving.Listen(o.Listen, o.AdminListen)
	if err != nil {
		return err
	}
	log.Info("kvgate global serving", "api", apiLn.Addr().String(), "admin", adminLn.Addr().String(), "members", len(o.Config.Spec.Members))
	if o.Ready != nil {
		o.Ready <- [2]string{apiLn.Addr().String(), adminLn.Addr().String()}
	}
	return serving.Serve(ctx, serving.NewAPI(r, log), apiLn, &http.Server{Handler: r.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}, adminLn,
		nil, r.Drain, o.DrainTimeout)
}

// Dependencies builds what the configuration asks for beyond the router: the
// authenticator (spec.auth) and the shared rate limiter (spec.rateLimit), with
// their metrics on the router's registry. The returned function releases them.
func Dependencies(ctx context.Context, cfg *Config, o *Options) (func(), error) {
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	if a := cfg.Spec.Auth; a != nil && (len(a.APIKeys) > 0 || a.JWT != nil) {
		au, err := auth.New(ctx, *a, auth.Options{Logger: o.Logger, Registerer: o.Metrics.Registry})
		if err != nil {
			return closeAll, fmt.Errorf("auth: %w", err)
		}
		closers = append(closers, au.Close)
		o.Auth = au
	}
	if rl := cfg.Spec.RateLimit; rl != nil {
		mode, err := ratelimit.ParseFailMode(cmp.Or(rl.FailMode, "open"))
		if err != nil {
			return closeAll, err
		}
		// The limiter bounds each call itself (rateLimit.timeout); the client's
		// own timeouts only keep a dead connection from lingering.
		client := redis.NewClient(&redis.Options{Addr: rl.Redis, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
			WriteTimeout: 2 * time.Second, MaxRetries: -1})
		closers = append(closers, func() { _ = client.Close() })
		// 200 ms, not the limiter's 50: under load a slow answer is not an
		// outage, and in fail-closed mode an outage refuses everyone.
		ro := ratelimit.Options{FailMode: mode, Logger: o.Logger, Metrics: ratelimit.NewMetrics(o.Metrics.Registry), Timeout: 200 * time.Millisecond}
		if rl.Timeout != nil {
			ro.Timeout = rl.Timeout.Duration
		}
		l := ratelimit.New(client, ro)
		o.Limiter = newSharedLimiter(l, cfg.Spec)
	}
	return closeAll, nil
}

// AdminHandler serves /metrics, /healthz, /readyz (ready while a member is
// healthy) and /debug/members.
func (r *Router) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		draining := r.draining
		r.mu.Unlock()
		if draining {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if r.opts.Auth != nil {
			if err := r.opts.Auth.Ready(); err != nil {
				http.Error(w, "authentication not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		now := time.Now()
		for _, m := range r.members {
			if m.evaluate(now, r.s).healthy {
				_, _ = w.Write([]byte("ok\n"))
				return
			}
		}
		http.Error(w, "no healthy member", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /debug/members", func(w http.ResponseWriter, _ *http.Request) {
		type out struct {
			Name, Region, URL string
			Price, Weight     float64
			Healthy           bool
			Ramp              float64
			InFlight          int64
			LastHeartbeat     time.Time
			LastError         string `json:",omitempty"`
			Summary           any
		}
		var list []out
		now := time.Now()
		for _, m := range r.members {
			v := m.evaluate(now, r.s)
			list = append(list, out{Name: m.cfg.Name, Region: m.cfg.Region, URL: m.cfg.URL, Price: m.price, Weight: m.weight, Healthy: v.healthy,
				Ramp: v.ramp, InFlight: m.inFlight.Load(), LastHeartbeat: v.lastOK, LastError: v.lastErr, Summary: v.summary})
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(list)
	})
	return mux
}
