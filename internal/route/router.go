// Package route is kvgate's routing core, shared by every front (`kvgate serve`'s
// HTTP handler, `kvgate epp`'s Envoy picker and the virtual-time benchmark): the
// schedulers built from an InferenceGatewayConfig, their endpoints and admission
// (in-flight limits, the priority wait queue), the decision (request → snapshot →
// picker → ranked endpoints) and the bookkeeping after it (prefix index, fleet
// accounting, first token, finish, the load summary). It knows nothing of HTTP
// handlers: a front calls Route, then the Route's methods as the response goes.
package route

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/latency"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// Options configure a Router.
type Options struct {
	Logger  *slog.Logger
	Metrics *telemetry.Gateway
	Seed    uint64
	// Fleet tunes the metric scrapers (interval, staleness, ...); its Now is the
	// router's clock, and External feeds metrics by Observe instead of scrapes
	// (the virtual-time benchmark).
	Fleet fleet.Config
	// Profile, when set, replaces the profile of every scheduler whose picker
	// is kvgate's, weights included (kvgate tune's candidates).
	Profile *schedule.Profile
	// DecisionLogEvery logs one decision in this many, with every candidate's
	// scores, at debug level (default 100; 1 logs all).
	DecisionLogEvery int
}

// Router routes OpenAI requests to model-server schedulers. Apply installs a
// configuration; requests in flight keep the one they started with.
type Router struct {
	opts   Options
	log    *slog.Logger
	m      *telemetry.Gateway
	routes atomic.Pointer[routes]

	// applyMu serializes Apply from start to end: what it builds before
	// taking mu (the authenticator) depends on the configuration it replaces.
	applyMu    sync.Mutex
	mu         sync.Mutex
	endpoints  map[string]*endpoint   // by scheduler and address; they outlive reloads
	sessions   map[string]*sessionMap // by scheduler name; they outlive reloads
	lastErr    error
	lastReload time.Time
	draining   atomic.Bool
	decisions  atomic.Uint64 // for the sampled decision log
	// freed is signalled whenever a request releases an endpoint. It lives on the
	// router, not on a configuration, so that a request that started before a
	// reload still wakes the requests waiting after it.
	freed broadcast
	// waiting orders the requests waiting for an endpoint by priority.
	waiting waitQueue
	// fleet scrapes every configured endpoint's metrics.
	fleet *fleet.Fleet
	// prefix remembers which prompt blocks went to which endpoint; chains are
	// seeded by model, so schedulers share it without mixing.
	prefix    *prefix.Index
	fleetCtx  context.Context
	stopFleet context.CancelFunc
	// recents holds each scheduler's recent request window (*recent), for
	// the load summary.
	recents sync.Map
	// decisionLogs holds each scheduler's last decisions (*decisionLog).
	decisionLogs sync.Map
	// peers links the router to the other replicas (SetPeers); share is its
	// place among them.
	peers atomic.Pointer[Peers]
	share atomic.Pointer[replicaShare]
	// started is when the first configuration was applied (Unix seconds).
	started atomic.Int64
}

// routes is one applied configuration, immutable once built.
type routes struct {
	cfg        *v1alpha1.InferenceGatewayConfig
	byModel    map[string]*scheduler // model names and adapter names
	schedulers []*scheduler
	maxBody    int64
	gw         v1alpha1.GatewaySpec
	// auth is spec.auth built; nil serves anyone.
	auth *authState
	// promptLimit is how much of a prompt the schedulers' prefix indexes hash, 0 when
	// none does.
	promptLimit int
	// objectives are the priorities of spec.objectives, by name, and their
	// time-to-first-token objectives.
	objectives map[string]int32
	sloOf      map[string]time.Duration
	// wantsUser says a scheduler takes session keys from the body's user
	// field, which a front then scans for.
	wantsUser bool
}

// scheduler is one configured scheduler (an InferencePool in Kubernetes): its endpoints, picker and upstream transport.
type scheduler struct {
	name      string
	spec      v1alpha1.SchedulerSpec
	endpoints []*endpoint
	byAddr    map[string]*endpoint
	picker    schedule.Picker
	transport *http.Transport
	prefix    prefixConfig
	outliers  outlierPolicy
	// prior is the pool's median learned speed, which an endpoint with too
	// few answers of its own borrows; refreshed at most every priorEvery.
	prior   atomic.Pointer[latency.Speed]
	priorAt atomic.Int64 // unix nanoseconds of the last refresh
	// observedAt is when an endpoint's answer last taught the pool's speeds
	// (unix nanoseconds): predictions older than sloFresh do not shed.
	observedAt atomic.Int64
	// sessions remembers which endpoint served each session last, when
	// the scheduler has sessionAffinity.
	sessions *sessionMap
	// tls checks the model servers' certificates (appProtocol https; nil
	// otherwise), for requests and scrapes alike.
	tls *backendTLS
	// saturation are the thresholds past which the pool is saturated: a
	// sheddable request is refused rather than queued inside an engine.
	saturation schedule.Thresholds
	// probes says the picker weighs learned speeds (predictedLatency): only
	// then may a wrong one keep an endpoint idle, and is it probed.
	probes bool
}

// priorEvery bounds how often a scheduler recomputes its pool's median speed.
const priorEvery = 100 * time.Millisecond

// poolSpeed is the speed an endpoint without enough answers of its own is
// assumed to have: its pool's median, or the default before any learned.
func (p *scheduler) poolSpeed() latency.Speed {
	if s := p.prior.Load(); s != nil {
		return *s
	}
	return latency.Default
}

// refreshPrior recomputes the pool's median speed, unless it did within
// priorEvery of now.
func (p *scheduler) refreshPrior(now time.Time) {
	last := p.priorAt.Load()
	if last != 0 && now.UnixNano()-last < int64(priorEvery) || !p.priorAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	speeds := make([]latency.Speed, len(p.endpoints))
	for i, e := range p.endpoints {
		speeds[i] = e.speed.Fit(latency.Default)
	}
	m := latency.Median(speeds)
	p.prior.Store(&m)
}

// prefixConfig is a scheduler's prefix-affinity setup; blockChars 0 turns it off.
type prefixConfig struct {
	blockChars, maxBlocks, capacity int
	seeds                           map[string]uint64 // by model or adapter name
}

// capacityOf is how many prompt blocks an endpoint's KV cache holds: its token
// capacity over about four characters a token, or the configured default.
func (c prefixConfig) capacityOf(m engine.Metrics) int {
	if m.NumBlocks > 0 && m.BlockSize > 0 {
		return min(max(1, m.NumBlocks*m.BlockSize*4/c.blockChars), maxPrefixCapacity)
	}
	return c.capacity
}

// maxPrefixCapacity bounds the prompt blocks the prefix index keeps for one
// endpoint (about 80 MB), whatever size its metrics claim: 16 times an H100's
// cache of an 8B model.
const maxPrefixCapacity = 1 << 20

// endpoint is one model server as this router sees it.
type endpoint struct {
	addr     string
	inFlight atomic.Int64
	gauge    prometheus.Gauge
	out      outlier
	// speed learns how fast the endpoint answers (predictedLatency).
	speed latency.Tracker
	// adapters are the LoRA adapters last sent there.
	adapters recentAdapters
	// peers counts the requests other replicas have in flight at its address,
	// as they last reported; admittedAt is when this replica last took a
	// slot there (Unix nanoseconds), for borrowWindow.
	peers      atomic.Int64
	admittedAt atomic.Int64
	// minute is its last minute of requests, for the fleet page.
	minute atomic.Pointer[lastMinute]
	// probe times its probes (probe.go).
	probe probeState
}

// tryAcquire takes an in-flight slot if the limit has room for one more (zero: no
// limit). The check and the increment are one atomic step, so concurrent
// requests of this replica cannot overshoot it.
func (e *endpoint) tryAcquire(limit slots) bool {
	for {
		n := e.inFlight.Load()
		ok, borrow := limit.room(int(n), int(e.peers.Load()))
		if !ok {
			return false
		}
		now := time.Now().UnixNano()
		if borrow {
			// A borrow waits until this replica's last slot there is in a
			// settled view; claiming the slot's time first lets one go.
			at := e.admittedAt.Load()
			if at >= limit.settled() || !e.admittedAt.CompareAndSwap(at, now) {
				return false
			}
		}
		if e.inFlight.CompareAndSwap(n, n+1) {
			e.admittedAt.Store(now)
			e.gauge.Set(float64(n + 1))
			return true
		}
	}
}

func (e *endpoint) release() { e.gauge.Set(float64(e.inFlight.Add(-1))) }

// New returns a router with no configuration; Route refuses with 503 until Apply.
func New(opts Options) *Router {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = telemetry.NewGateway()
	}
	if opts.DecisionLogEvery <= 0 {
		opts.DecisionLogEvery = 100
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Router{opts: opts, log: opts.Logger, m: opts.Metrics, endpoints: map[string]*endpoint{}, sessions: map[string]*sessionMap{},
		fleet: fleet.New(opts.Fleet), prefix: prefix.New(), fleetCtx: ctx, stopFleet: cancel}
	// A registry shared by several routers (tests) keeps the first one's collector.
	_ = opts.Metrics.Registry.Register(newFleetCollector(g))
	return g
}

// Close stops the router's scrapers.
func (g *Router) Close() {
	g.fleet.Close()
	g.stopFleet()
	if rt := g.routes.Load(); rt != nil && rt.auth != nil {
		rt.auth.a.Close()
	}
}

// Metrics returns the router's metrics.
func (g *Router) Metrics() *telemetry.Gateway { return g.m }

// Apply installs a validated configuration atomically. Endpoints that stay keep
// their in-flight counts; requests in flight finish on the configuration they
// started with. It loads what the configuration names (JWKS, CA files), builds
// the new table (build) and installs it (install).
func (g *Router) Apply(cfg *v1alpha1.InferenceGatewayConfig) error {
	if errs := cfg.Validate(); len(errs) > 0 {
		return fmt.Errorf("invalid configuration: %w", errs[0])
	}
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	if len(cfg.Spec.Objectives) > 0 && cfg.Spec.Gateway.InFlightLimit() == 0 && !hasSLO(cfg) {
		// Nobody waits without a limit: only sheddable objectives act, at
		// saturation.
		g.log.Warn("spec.objectives order nothing without spec.gateway.maxInFlightPerEndpoint: with no limit no request waits; a priority below 0 is still shed when every endpoint is saturated")
	}
	// Built before the lock: a new JWKS is fetched (bounded by its timeout).
	as, freshAuth, err := g.buildAuth(cfg.Spec.Auth)
	if err != nil {
		return err
	}
	applied := false
	defer func() {
		if freshAuth && !applied {
			as.a.Close()
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.routes.Load()
	tlsOf, err := g.backendTLSOf(cfg.Spec.Schedulers, reusable(old, cfg.Spec.Gateway))
	if err != nil {
		return err
	}
	b, err := build(cfg, old, buildEnv{profile: g.opts.Profile, seed: g.opts.Seed, timer: g.m.PluginTimer, auth: as, tls: tlsOf, endpoints: g.endpoints, sessions: g.sessions})
	if err != nil {
		return err
	}
	g.install(b)
	applied = true
	return nil
}

// hasSLO says whether any objective or scheduler sets a time-to-first-token
// objective.
func hasSLO(cfg *v1alpha1.InferenceGatewayConfig) bool {
	for _, o := range cfg.Spec.Objectives {
		if o.TTFTSLO != nil && o.TTFTSLO.Duration > 0 {
			return true
		}
	}
	return slices.ContainsFunc(cfg.Spec.Schedulers, func(sc v1alpha1.SchedulerSpec) bool { return sc.SLO() > 0 })
}

// reusable are old's schedulers by name, whose pickers and transports a new
// configuration may keep: none when spec.gateway changed.
func reusable(old *routes, gw v1alpha1.GatewaySpec) map[string]*scheduler {
	prev := map[string]*scheduler{}
	if old != nil && reflect.DeepEqual(old.gw, gw) {
		for _, p := range old.schedulers {
			prev[p.name] = p
		}
	}
	return prev
}

// buildEnv is what build reads besides the configuration: the router's
// options, what Apply loaded (auth, backend TLS) and the registries that
// outlive reloads, read and never written.
type buildEnv struct {
	profile   *schedule.Profile
	seed      uint64
	timer     schedule.Timer
	auth      *authState
	tls       map[string]*backendTLS
	endpoints map[string]*endpoint   // by scheduler and address
	sessions  map[string]*sessionMap // by scheduler
}

// built is a routing table ready to install, with what install must do
// around it.
type built struct {
	rt *routes
	// fresh are the endpoints the registry does not hold yet, by key;
	// sessions the session maps it does not.
	fresh    map[string]*endpoint
	sessions map[string]*sessionMap
	// kept are old's transports the new table reuses (their connections stay).
	kept map[*http.Transport]bool
	// targets are the endpoints to scrape.
	targets []fleet.Target
}

// build makes the routing table of cfg, reusing from old (the table serving
// now, nil at first) the pickers, transports and learned speeds of the
// schedulers whose settings did not change. It changes nothing: install
// does.
func build(cfg *v1alpha1.InferenceGatewayConfig, old *routes, env buildEnv) (*built, error) {
	gw := cfg.Spec.Gateway
	rt := &routes{cfg: cfg, byModel: map[string]*scheduler{}, maxBody: cfg.Spec.BBR.MaxBodyBytes(), gw: gw, objectives: map[string]int32{},
		sloOf: map[string]time.Duration{}, auth: env.auth}
	for _, o := range cfg.Spec.Objectives {
		rt.objectives[o.Name] = o.Priority
		if o.TTFTSLO != nil {
			rt.sloOf[o.Name] = o.TTFTSLO.Duration
		}
	}
	b := &built{rt: rt, fresh: map[string]*endpoint{}, sessions: map[string]*sessionMap{}, kept: map[*http.Transport]bool{}}
	prev := reusable(old, gw)
	for i, sc := range cfg.Spec.Schedulers {
		rt.wantsUser = rt.wantsUser || sc.SessionFromUser()
		p, err := b.scheduler(sc, prev[sc.Name], env, env.seed+uint64(i))
		if err != nil {
			return nil, err
		}
		if p.prefix.blockChars > 0 {
			rt.promptLimit = max(rt.promptLimit, p.prefix.blockChars*p.prefix.maxBlocks)
		}
		rt.schedulers = append(rt.schedulers, p)
		rt.byModel[sc.ModelName] = p
		for _, a := range sc.LoRAAdapters {
			rt.byModel[a] = p
		}
	}
	for _, p := range rt.schedulers {
		// Validate accepted the map; one it could not build fails every scrape
		// with the reason.
		m, err := engine.MapFor(p.spec.EngineType, p.spec.Metrics)
		if err != nil {
			m = engine.Refusing(err)
		}
		for _, e := range p.endpoints {
			t := fleet.Target{Addr: e.addr, Map: m}
			if p.tls != nil {
				t.TLS = p.tls
			}
			b.targets = append(b.targets, t)
		}
	}
	return b, nil
}

// scheduler builds one scheduler of the table, from old when only its
// endpoints changed (pods came or went): it keeps its picker and its
// transport, with the connections open.
func (b *built) scheduler(sc v1alpha1.SchedulerSpec, old *scheduler, env buildEnv, seed uint64) (*scheduler, error) {
	gw := b.rt.gw
	var p *scheduler
	if old != nil && sameSettings(old.spec, sc) {
		p = &scheduler{name: sc.Name, spec: sc, picker: old.picker, transport: old.transport, tls: old.tls}
		b.kept[old.transport] = true
	} else {
		picker, err := newPicker(sc, env.profile, seed, env.timer)
		if err != nil {
			return nil, fmt.Errorf("scheduler %s: %w", sc.Name, err)
		}
		bt := env.tls[sc.Name]
		p = &scheduler{name: sc.Name, spec: sc, picker: picker, transport: newTransport(gw, sc.H2C(), bt), tls: bt}
	}
	p.saturation = saturationOf(sc)
	// What the pool learned of its speed outlives a reload, as the
	// endpoints' own models do.
	if old != nil {
		p.prior.Store(old.prior.Load())
		p.priorAt.Store(old.priorAt.Load())
		p.observedAt.Store(old.observedAt.Load())
	}
	p.outliers.failures, p.outliers.base, p.outliers.maxShare = gw.Outliers()
	if sc.SessionAffinity != nil {
		p.sessions = env.sessions[sc.Name]
		if p.sessions == nil {
			p.sessions = newSessionMap(sc.SessionTTL())
			b.sessions[sc.Name] = p.sessions
		}
	}
	p.probes = usesSpeed(sc, env.profile)
	if usesPrefix(sc, env.profile) {
		p.prefix = prefixConfig{blockChars: sc.PrefixBlockChars(), maxBlocks: sc.PrefixMaxBlocks(), capacity: sc.PrefixCapacity(),
			seeds: map[string]uint64{sc.ModelName: prefix.Seed(sc.ModelName, "")}}
		for _, a := range sc.LoRAAdapters {
			p.prefix.seeds[a] = prefix.Seed(sc.ModelName, a)
		}
	}
	p.byAddr = make(map[string]*endpoint, len(sc.Endpoints))
	for _, addr := range sc.Endpoints {
		key := sc.Name + "|" + addr
		ep := env.endpoints[key]
		if ep == nil {
			if ep = b.fresh[key]; ep == nil {
				ep = &endpoint{addr: addr}
				b.fresh[key] = ep
			}
		}
		p.endpoints = append(p.endpoints, ep)
		p.byAddr[addr] = ep
	}
	return p, nil
}

// install makes b the table serving from now on: it registers its new
// endpoints and session maps, forgets what no scheduler uses any more, points
// the scrapers at its endpoints and swaps it in. Called with mu held.
func (g *Router) install(b *built) {
	rt := b.rt
	for key, ep := range b.fresh {
		name, addr, _ := strings.Cut(key, "|")
		ep.gauge = g.m.InFlight.WithLabelValues(name, addr)
		g.endpoints[key] = ep
	}
	for _, p := range rt.schedulers {
		if p.sessions != nil {
			p.sessions.setTTL(p.spec.SessionTTL())
		}
	}
	maps.Copy(g.sessions, b.sessions)
	for name := range g.sessions {
		if !slices.ContainsFunc(rt.schedulers, func(p *scheduler) bool { return p.name == name && p.sessions != nil }) {
			delete(g.sessions, name)
		}
	}
	// Endpoints no longer configured and idle are forgotten, with their gauge.
	keep := map[string]bool{}
	inUse := map[string]bool{}
	for _, p := range rt.schedulers {
		for _, e := range p.endpoints {
			keep[p.name+"|"+e.addr] = true
			inUse[e.addr] = true
		}
	}
	for key, e := range g.endpoints {
		if !keep[key] && e.inFlight.Load() == 0 {
			name, addr, _ := strings.Cut(key, "|")
			g.m.InFlight.DeleteLabelValues(name, addr)
			delete(g.endpoints, key)
		}
	}
	// What went to an endpoint that left says nothing about one that may later
	// reuse its address.
	if prev := g.routes.Load(); prev != nil {
		for _, p := range prev.schedulers {
			for _, e := range p.endpoints {
				if !inUse[e.addr] {
					g.prefix.Forget(e.addr)
				}
			}
		}
	}
	g.fleet.SetConfig(g.fleetConfig(rt.gw))
	g.fleet.Sync(g.fleetCtx, b.targets)
	old := g.routes.Swap(rt)
	if old != nil && old.auth != nil && old.auth != rt.auth {
		// Requests that already passed it do not need it again; its JWKS
		// refresh stops.
		old.auth.a.Close()
	}
	g.lastErr, g.lastReload = nil, time.Now()
	g.started.CompareAndSwap(0, g.lastReload.Unix())
	g.m.ConfigAccepted.Set(1)
	if old != nil {
		// Idle connections of the old transports go; busy ones finish their request.
		for _, p := range old.schedulers {
			if !b.kept[p.transport] {
				p.transport.CloseIdleConnections()
			}
		}
	}
}

// sameSettings says whether two specs of a scheduler differ at most in their
// endpoints.
func sameSettings(a, b v1alpha1.SchedulerSpec) bool {
	a.Endpoints, b.Endpoints = nil, nil
	return reflect.DeepEqual(a, b)
}

// RecordRejected notes a configuration that failed to load, for /debug/config and
// the metrics; the previous configuration keeps serving.
func (g *Router) RecordRejected(err error) {
	g.mu.Lock()
	g.lastErr, g.lastReload = err, time.Now()
	g.mu.Unlock()
	g.m.ConfigAccepted.Set(0)
}

// Drain marks the router as shutting down: Ready and Draining say so from now on.
func (g *Router) Drain() { g.draining.Store(true) }

// newTransport builds the upstream transport of a scheduler, sized for thousands of
// concurrent streams; with bt, https URLs are dialed over TLS checked by it,
// HTTP/2 when the server offers it by ALPN, else HTTP/1.1.
func newTransport(gw v1alpha1.GatewaySpec, h2c bool, bt *backendTLS) *http.Transport {
	d := &net.Dialer{Timeout: gw.Connect(), KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        0, // no global cap
		MaxIdleConnsPerHost: 1024,
		MaxConnsPerHost:     0,
		// Shorter than the keep-alive of the model servers' HTTP stacks (uvicorn: 5 s),
		// so the gateway never sends a request on a connection the server is closing.
		IdleConnTimeout:       4 * time.Second,
		ResponseHeaderTimeout: gw.HeaderTimeout(),
		DisableCompression:    true, // bodies pass through as the server sent them
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		t.Protocols = &p
	}
	if bt != nil {
		t.DialTLSContext = bt.dialTLS(d, gw.Connect())
		t.ForceAttemptHTTP2 = true // a custom TLS dialer turns HTTP/2 off otherwise
	}
	return t
}

// broadcast wakes every waiter each time it is signalled.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) signal() {
	b.mu.Lock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	b.mu.Unlock()
}

// snapshotScratch is the memory of one request's candidate lists, reused across
// requests.
type snapshotScratch struct {
	eps     []schedule.Endpoint
	refs    []*endpoint // aligned with eps
	addrs   []string
	snaps   []fleet.Snapshot
	matched []int
	// down counts the endpoints left out because the fleet knows them down,
	// full those left out at their in-flight limit (and not down); soon says
	// one of those may borrow a slot within a borrow window.
	down, full int
	soon       bool
	// recovered are the endpoints whose outage this snapshot ended.
	recovered []string
}

var snapshotPool = sync.Pool{New: func() any { return new(snapshotScratch) }}

// snapshot lists a scheduler's endpoints below limit for the picker, with their
// scraped metrics and, for a prompt's block hashes and its adapter, their
// prefix and adapter affinity. The
// list lives in sc. A non-nil subset keeps only the endpoints it names.
//
// An endpoint the fleet knows is down — scraped once, then its scrapes getting
// no answer (refused, timed out) unhealthyAfter times in a row or for longer
// than staleAfter: killed or frozen — is left out: a request sent there waits
// for a timeout. One whose /metrics answers an error may still serve, and
// stays; so does one never scraped (just started, or publishing no metrics),
// read as unhealthy: picked only when nothing else is left.
func (p *scheduler) snapshot(fl *fleet.Fleet, idx *prefix.Index, hashes []uint64, adapter string, limit slots, subset []string, session string, now time.Time, sc *snapshotScratch) []schedule.Endpoint {
	addrs, refs := sc.addrs[:0], sc.refs[:0]
	prior := p.poolSpeed()
	for _, e := range p.endpoints {
		if subset != nil && !slices.Contains(subset, e.addr) {
			continue
		}
		addrs = append(addrs, e.addr)
		refs = append(refs, e)
	}
	// Aligned with addrs: one lookup per endpoint on the request path.
	sc.snaps = fl.AppendSnapshots(sc.snaps[:0], addrs)
	out, kept := sc.eps[:0], 0
	sc.down, sc.full, sc.soon, sc.recovered = 0, 0, false, sc.recovered[:0]
	for i := range sc.snaps {
		s, e := &sc.snaps[i], refs[i]
		if down(s) {
			e.sawDown()
			sc.down++
			continue
		}
		if e.recovered(s, now) {
			sc.recovered = append(sc.recovered, e.addr)
		}
		n := int(e.inFlight.Load())
		if ok, soon := e.admits(limit, now); !ok {
			sc.full++
			sc.soon = sc.soon || soon
			continue
		}
		// An ejected endpoint reads as unhealthy: picked only when nothing
		// healthy is left, and a last fallback.
		healthy := s.Healthy && !e.ejected(now)
		out = append(out, schedule.Endpoint{Address: e.addr, InFlight: n,
			Signals: schedule.Signals{Metrics: s.Metrics, HasMetrics: s.Scraped, Healthy: healthy, Stale: s.Stale, PrefillTokens: float64(s.PrefillTokens), PrefillWork: float64(s.PrefillWork),
				ErrorRate: e.errorRate(now), Speed: e.speed.Speed(prior), Session: session != "" && e.addr == session}})
		if adapter != "" && s.HasLoRA {
			c := &out[len(out)-1]
			c.AdapterLoaded, c.AdaptersHeld = e.adapters.held(adapter, s.MaxLoRA)
		}
		addrs[kept], refs[kept] = e.addr, e
		kept++
	}
	addrs, refs = addrs[:kept], refs[:kept]
	if len(hashes) > 0 {
		if cap(sc.matched) < len(addrs) {
			sc.matched = make([]int, len(addrs))
		}
		matched := sc.matched[:len(addrs)]
		idx.Match(hashes, addrs, matched)
		for i, n := range matched {
			out[i].PrefixMatch = float64(n) / float64(len(hashes))
		}
	}
	sc.eps, sc.addrs, sc.refs = out, addrs, refs
	return out
}

// fleetConfig is the scrapers' configuration: the router's options with the
// configuration file's settings on top.
func (g *Router) fleetConfig(gw v1alpha1.GatewaySpec) fleet.Config {
	c := g.opts.Fleet
	if sp := gw.Scrape; sp != nil {
		if sp.Interval != nil {
			c.Interval = gw.ScrapeInterval()
		}
		if sp.Timeout != nil {
			c.Timeout = gw.ScrapeTimeout()
		}
		if sp.StaleAfter != nil {
			c.StaleAfter = gw.StaleAfter()
		}
		if sp.UnhealthyAfter != nil {
			c.UnhealthyAfter = gw.UnhealthyAfter()
		}
	}
	return c
}

// usesSpeed says whether a scheduler's picker scores learned speeds.
func usesSpeed(sc v1alpha1.SchedulerSpec, override *schedule.Profile) bool {
	pr, err := profile(sc, override)
	return err == nil && sc.PickerName() == schedule.PickerKvgate && pr.Weights[v1alpha1.ScorerPredictedLatency] > 0
}

// usesPrefix says whether a scheduler's picker scores prefix affinity.
func usesPrefix(sc v1alpha1.SchedulerSpec, override *schedule.Profile) bool {
	pr, err := profile(sc, override)
	return err == nil && sc.PickerName() == schedule.PickerKvgate && pr.UsesPrefix()
}

// newPicker builds a scheduler's picker: the GPU-aware weighted picker for
// "kvgate" (the default), its filters and scorers timed by timer in one
// decision of schedule.TimeOneIn, or a baseline.
func newPicker(sc v1alpha1.SchedulerSpec, override *schedule.Profile, seed uint64, timer schedule.Timer) (schedule.Picker, error) {
	if sc.PickerName() != schedule.PickerKvgate {
		return schedule.New(sc.PickerName(), seed)
	}
	pr, err := profile(sc, override)
	if err != nil {
		return nil, err
	}
	return schedule.NewWeighted(pr, saturationOf(sc), seed).WithTimer(timer, schedule.TimeOneIn), nil
}

// saturationOf is a scheduler's saturation thresholds.
func saturationOf(sc v1alpha1.SchedulerSpec) schedule.Thresholds {
	return schedule.Thresholds{Queue: float64(sc.SaturationQueue()), KVUsage: sc.SaturationKV()}
}

// profile is a scheduler's profile with its own weights on top.
func profile(sc v1alpha1.SchedulerSpec, override *schedule.Profile) (schedule.Profile, error) {
	var pr schedule.Profile
	if override != nil {
		pr = *override
		pr.Weights = maps.Clone(override.Weights)
	} else {
		var err error
		if pr, err = schedule.LookupProfile(sc.ProfileName()); err != nil {
			return pr, err
		}
		w := pr.Weights
		if sw := sc.Weights; sw != nil {
			for name, v := range sw.ByName() {
				if v != nil {
					w[name] = float64(*v)
				}
			}
		}
	}
	if len(sc.LoRAAdapters) > 0 {
		pr = pr.WithAdapters()
	}
	if sc.SessionAffinity != nil {
		pr = pr.WithSessions()
	}
	return pr, nil
}

func (p *scheduler) endpoint(addr string) *endpoint {
	if p.byAddr != nil {
		return p.byAddr[addr]
	}
	i := slices.IndexFunc(p.endpoints, func(e *endpoint) bool { return e.addr == addr })
	if i < 0 {
		return nil
	}
	return p.endpoints[i]
}

// now is the router's clock: the fleet's, which the virtual-time benchmark sets.
func (g *Router) now() time.Time {
	if g.opts.Fleet.Now != nil {
		return g.opts.Fleet.Now()
	}
	return time.Now()
}

// down says whether the fleet knows an endpoint is gone or frozen: scraped once,
// then its scrapes getting no answer, unhealthyAfter times or for staleAfter.
func down(s *fleet.Snapshot) bool { return s.Scraped && s.Unreachable && (!s.Healthy || s.Stale) }
