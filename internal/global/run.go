package global

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/ratelimit"
	"github.com/kvgate/kvgate/internal/reload"
	"github.com/kvgate/kvgate/internal/serving"
)

// ServerOptions configure Run.
type ServerOptions struct {
	// ConfigPath is the configuration file: read at start (unless Config is
	// set), and again when it changes and on every value from Reload.
	ConfigPath string
	// Config, when set, is served at start instead of reading ConfigPath; the
	// file's contents at start are then taken as applied, so a file that
	// differs from Config applies on its next change or on Reload.
	Config       *Config
	Reload       <-chan os.Signal
	Listen       string // OpenAI API (default :8080)
	AdminListen  string // metrics, health, /debug/members (default :9090)
	DrainTimeout time.Duration
	// PreStop is how long the API listener keeps accepting after a stop
	// signal, with /readyz failing, before the drain (0: none).
	PreStop time.Duration
	Router  Options
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
	var initial []byte
	if o.Config == nil && o.ConfigPath == "" {
		return errors.New("no configuration: set ConfigPath or Config")
	}
	if o.Config == nil {
		var err error
		if initial, err = os.ReadFile(o.ConfigPath); err != nil {
			return err
		}
		if o.Config, err = Parse(o.ConfigPath, initial); err != nil {
			return err
		}
	} else if o.ConfigPath != "" {
		initial, _ = os.ReadFile(o.ConfigPath) // nil: the first check reloads
	}
	d := newDeps(hbCtx, &o.Router)
	defer d.close()
	var err error
	if o.Router.Auth, o.Router.Limiter, _, err = d.build(o.Config, false); err != nil {
		return err
	}
	r := New(o.Config, o.Router)
	if r.adminErr != nil {
		return r.adminErr
	}
	r.Start(hbCtx)
	r.recordLoad(o.Config, nil)
	warnDeprecated(log, o.Config)
	apiLn, adminLn, err := serving.Listen(o.Listen, o.AdminListen)
	if err != nil {
		return err
	}
	if o.ConfigPath != "" {
		watchCtx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			reload.Watch(watchCtx, o.ConfigPath, initial, o.Reload, log, func(data []byte, err error) {
				r.reload(o.ConfigPath, data, err, d)
			})
		}()
		// Before the dependencies close (deferred earlier, run later): a reload
		// under way must not build after them.
		defer func() { stopWatch(); <-watched }()
	}
	log.Info("kvgate global serving", "api", apiLn.Addr().String(), "admin", adminLn.Addr().String(), "members", len(o.Config.Spec.Members))
	if o.Ready != nil {
		o.Ready <- [2]string{apiLn.Addr().String(), adminLn.Addr().String()}
	}
	return serving.Serve(ctx, serving.NewAPI(r, log), apiLn, &http.Server{Handler: r.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}, adminLn,
		nil, r.Drain, serving.Drain{PreStop: o.PreStop, Timeout: o.DrainTimeout})
}

// reload applies a configuration file's new contents; a file that does not
// parse or validate, or whose authenticator or limiter cannot be built, leaves
// the previous configuration serving.
func (r *Router) reload(path string, data []byte, readErr error, d *deps) {
	cfg, err := Parse(path, data)
	if readErr != nil {
		err = readErr
	}
	var a *auth.Authenticator
	var l Limiter
	var retire func()
	if err == nil {
		a, l, retire, err = d.build(cfg, true)
	}
	if err != nil {
		r.m.Reloads.WithLabelValues("failure").Inc()
		r.recordLoad(nil, err)
		r.log.Error("configuration rejected; the previous one keeps serving", "err", err)
		return
	}
	r.Apply(cfg, a, l, retire)
	r.m.Reloads.WithLabelValues("success").Inc()
	r.recordLoad(cfg, nil)
	r.log.Info("configuration reloaded", "members", len(cfg.Spec.Members))
	warnDeprecated(r.log, cfg)
}

// warnDeprecated logs each former field name an applied configuration used,
// once per load, so that its author renames it before the name goes.
func warnDeprecated(log *slog.Logger, cfg *Config) {
	for _, w := range cfg.Deprecated() {
		log.Warn(w)
	}
}

// recordLoad notes the outcome of loading a configuration for /debug/config.
func (r *Router) recordLoad(cfg *Config, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loadedAt, r.loadErr = time.Now(), err
	if cfg != nil {
		r.active = cfg
	}
	r.m.ConfigOK.Set(b2f(err == nil))
}

// deps builds a configuration's authenticator (spec.auth) and shared limiter
// (spec.rateLimit), reusing the previous build's where that part of the
// configuration did not change, so that a reload keeps the JWKS cache, the
// Redis connections and the local fallback buckets.
type deps struct {
	ctx context.Context
	log *slog.Logger
	m   *Metrics
	rlm *ratelimit.Metrics // registered once, shared by every limiter built

	authSpec *v1alpha1.AuthSpec
	au       *auth.Authenticator
	rlSpec   *RateLimit
	rl       *ratelimit.Limiter
	rlClose  func()
}

func newDeps(ctx context.Context, o *Options) *deps {
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	return &deps{ctx: ctx, log: cmp.Or(o.Logger, slog.Default()), m: o.Metrics}
}

// build returns cfg's authenticator and limiter (nil when not configured) and
// a function that releases what the previous build made and this one no longer
// uses, to call once no request uses it. On error nothing changes. On a
// reload, a new JWT authenticator that could not load its JWKS is an error: the
// one serving keeps its keys rather than every token failing.
func (d *deps) build(cfg *Config, reload bool) (*auth.Authenticator, Limiter, func(), error) {
	var retire []func()
	au, authSpec := d.au, d.authSpec
	if a := cfg.Spec.Auth; !reflect.DeepEqual(a, d.authSpec) {
		au, authSpec = nil, a
		if a != nil && (len(a.APIKeys) > 0 || a.JWT != nil) {
			var err error
			if au, err = auth.New(d.ctx, a, auth.Options{Logger: d.log, Registerer: d.m.Registry}); err != nil {
				return nil, nil, nil, fmt.Errorf("auth: %w", err)
			}
			// Refused only when it would lose keys the running one has: with
			// both unready (the issuer down since before), an API key
			// rotation must still go through.
			if err := au.Ready(); reload && err != nil && (d.au == nil || d.au.Ready() == nil) {
				au.Close()
				return nil, nil, nil, fmt.Errorf("auth: %w", err)
			}
		}
		if d.au != nil {
			retire = append(retire, d.au.Close)
		}
	}
	rl, rlSpec, rlClose := d.rl, d.rlSpec, d.rlClose
	if c := cfg.Spec.RateLimit; !sameRedis(c, d.rlSpec) {
		rl, rlSpec, rlClose = nil, c, nil
		if c != nil {
			var err error
			if rl, rlClose, err = d.limiter(c); err != nil {
				if au != d.au && au != nil {
					au.Close()
				}
				return nil, nil, nil, err
			}
		}
		if d.rlClose != nil {
			retire = append(retire, d.rlClose)
		}
	}
	d.au, d.authSpec, d.rl, d.rlSpec, d.rlClose = au, authSpec, rl, rlSpec, rlClose
	var l Limiter
	if rl != nil {
		// Rebuilt every time: the limits live in spec.tenants and spec.models.
		l = newSharedLimiter(rl, cfg.Spec)
	}
	return au, l, func() {
		for _, f := range retire {
			f()
		}
	}, nil
}

// sameRedis says whether a limiter built for b serves a: the same Redis, fail
// mode and timeout (the rest of rateLimit is read per request).
func sameRedis(a, b *RateLimit) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Redis == b.Redis && a.FailMode == b.FailMode && reflect.DeepEqual(a.Timeout, b.Timeout)
}

// limiter connects a shared limiter to the configured Redis.
func (d *deps) limiter(c *RateLimit) (*ratelimit.Limiter, func(), error) {
	mode, err := ratelimit.ParseFailMode(cmp.Or(c.FailMode, "open"))
	if err != nil {
		return nil, nil, err
	}
	if d.rlm == nil {
		d.rlm = ratelimit.NewMetrics(d.m.Registry)
	}
	// The limiter bounds each call itself (rateLimit.timeout); the client's own
	// timeouts only keep a dead connection from lingering.
	// No retries inside go-redis (of a command, or of a refused dial): the
	// limiter decides what a failure means and probes again itself. A pool
	// larger than go-redis's 10 per CPU: every admitted request makes a call,
	// and on a busy node calls last long enough to queue for a connection.
	// A dial's error goes to the request that asked for it, so a dial that
	// times out is a 503 (fail-closed) although a connection freed meanwhile
	// would have served it. A burst dials many connections at once, which a
	// busy single-threaded Redis is slow to accept: Linux resends a dropped
	// SYN after 1 s and 3 s, so the dial waits 5 s (go-redis's default) —
	// the limiter's own wait, not the dial's, bounds the request. A few
	// connections dialled ahead serve the first burst without dialling.
	client := redis.NewClient(&redis.Options{Addr: c.Redis, DialTimeout: 5 * time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: 2 * time.Second, MaxRetries: -1, DialerRetries: 1, PoolSize: 64 * runtime.GOMAXPROCS(0),
		MinIdleConns: 4 * runtime.GOMAXPROCS(0)})
	// 200 ms, not the limiter's 50: under load a slow answer is not an outage,
	// and in fail-closed mode an outage refuses everyone.
	ro := ratelimit.Options{FailMode: mode, Logger: d.log, Metrics: d.rlm, Timeout: 200 * time.Millisecond}
	if c.Timeout != nil {
		ro.Timeout = c.Timeout.Duration
	}
	return ratelimit.New(client, ro), func() { _ = client.Close() }, nil
}

// close releases what the last build made.
func (d *deps) close() {
	if d.au != nil {
		d.au.Close()
	}
	if d.rlClose != nil {
		d.rlClose()
	}
}

// Dependencies builds what the configuration asks for beyond the router — the
// authenticator and the shared rate limiter, with their metrics on the
// router's registry — into o. The returned function releases them.
func Dependencies(ctx context.Context, cfg *Config, o *Options) (func(), error) {
	d := newDeps(ctx, o)
	var err error
	o.Auth, o.Limiter, _, err = d.build(cfg, false)
	return d.close, err
}

// AdminHandler serves /metrics, /healthz, /readyz (ready while a member is
// healthy), /debug/config and /debug/members: health answers everyone, the
// debug pages only whom Options.Admin admits, as kvgate serve's do.
func (r *Router) AdminHandler() http.Handler {
	return r.admin.Mux(host.AdminPages{
		Metrics: promhttp.HandlerFor(r.m.Registry, promhttp.HandlerOpts{}),
		Open: map[string]http.HandlerFunc{
			"GET /healthz": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) },
			"GET /readyz":  r.serveReadyz,
		},
		Protected: map[string]http.HandlerFunc{
			"GET /debug/config":  r.serveDebugConfig,
			"GET /debug/members": r.serveDebugMembers,
		},
	})
}

func (r *Router) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	draining := r.draining
	r.mu.Unlock()
	if draining {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	g := r.gen.Load()
	if g.auth != nil {
		if err := g.auth.Ready(); err != nil {
			http.Error(w, "authentication not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	now := time.Now()
	for _, m := range g.members {
		if m.evaluate(now, g.s).healthy {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
	}
	http.Error(w, "no healthy member", http.StatusServiceUnavailable)
}

// serveDebugConfig shows the configuration in force, without its secrets,
// and the outcome of the last load.
func (r *Router) serveDebugConfig(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	cfg, when, lerr := r.active, r.loadedAt, r.loadErr
	r.mu.Unlock()
	out := map[string]any{"lastReload": when.UTC().Format(time.RFC3339Nano), "lastReloadAccepted": lerr == nil}
	if lerr != nil {
		out["lastReloadError"] = lerr.Error()
	}
	if cfg != nil {
		if y, err := yaml.Marshal(redacted(cfg)); err == nil {
			out["active"] = string(y)
		}
	}
	writeJSON(w, out)
}

func (r *Router) serveDebugMembers(w http.ResponseWriter, _ *http.Request) {
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
	g := r.gen.Load()
	for _, m := range g.members {
		v := m.evaluate(now, g.s)
		pol := m.policy.Load()
		list = append(list, out{Name: m.cfg.Name, Region: pol.region, URL: config.RedactURL(m.cfg.URL), Price: pol.price, Weight: pol.weight, Healthy: v.healthy,
			Ramp: v.ramp, InFlight: m.inFlight.Load(), LastHeartbeat: v.lastOK, LastError: v.lastErr, Summary: v.summary})
	}
	writeJSON(w, list)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// redacted is a copy of cfg that holds no secret, for /debug/config, as
// kvgate serve's: URL credentials redacted, API key hashes replaced,
// annotations and managed fields (a whole copy of the document, for one)
// dropped.
func redacted(cfg *Config) *Config {
	out := *cfg
	out.Metadata = *cfg.Metadata.DeepCopy()
	out.Metadata.Annotations, out.Metadata.ManagedFields = nil, nil
	out.Spec.Members = slices.Clone(cfg.Spec.Members)
	for i := range out.Spec.Members {
		m := &out.Spec.Members[i]
		m.URL, m.AdminURL = config.RedactURL(m.URL), config.RedactURL(m.AdminURL)
	}
	out.Spec.Auth = config.RedactedAuth(cfg.Spec.Auth)
	return &out
}
