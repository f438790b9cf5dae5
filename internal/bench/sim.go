// Package bench runs kvgate's scheduler against simulated model servers — in
// virtual time, with the same picker, prefix index and in-flight accounting as
// `kvgate serve` — and against live OpenAI-compatible endpoints, and compares
// policies scenario by scenario.
package bench

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Policies are the routing policies a benchmark compares: the baselines users
// would otherwise run (pickers a gateway offers, then what a fleet gets without
// one: a Kubernetes Service and static weights), GIE's default weights, llm-d's
// and Dynamo's default rules, kvgate's profiles (ProfileKvgate is the profile a
// scheduler gets when it names none), and the oracle, a reference.
// PolicyDescriptions says what each does.
var Policies = []string{"round-robin", "least-request", "random", "power-of-two",
	KubeProxy, KubeProxyIPVS, WeightedRoundRobin, string(v1alpha1.ProfileGIEDefault), string(v1alpha1.ProfileLLMDSticky),
	string(v1alpha1.ProfileDynamoKV), string(v1alpha1.ProfileKvgate), string(v1alpha1.ProfileChat),
	string(v1alpha1.ProfileBatch), ChatFixedSpeed, PredictedLatency, Oracle}

// SimOptions configure one virtual-time run.
type SimOptions struct {
	Fleet  simserver.FleetSpec
	Policy string
	// Profile, when set, replaces the policy's weights (kvgate tune).
	Profile *schedule.Profile
	// ScrapeInterval and StaleAfter are the gateway's (defaults 50 ms and 2 s).
	ScrapeInterval, StaleAfter time.Duration
	Seed                       uint64
	// Clients is the number of client connections kube-proxy balances; 0 means
	// 4 per server.
	Clients int
	// Draw numbers the run of a randomised policy (kube-proxy: which pod each
	// connection drew); it offsets the policy's seed.
	Draw int
	// Draws is read by Jobs only: runs per randomised policy (PolicyDraws).
	Draws int
	// Replicas is how many gateway replicas route the trace (0 or 1: one),
	// each request to one as spreadOver says; Shared makes them share state,
	// SyncDelay late, loads published every SyncEvery (0 and 0: at once), as
	// replicas.go models it.
	Replicas             int
	Shared               bool
	SyncDelay, SyncEvery time.Duration
	// probe, in tests, receives the server each request was routed to.
	probe func(server []int)
	// record, in tests, receives every event the router saw, in virtual order.
	record func(simEvent)
	// exhaustive, in tests, has the oracle try every engine (no pruning).
	exhaustive bool
}

// simEvent is one call the run made into the routing core: a scrape's metrics,
// a pick (its request and the endpoint chosen), a first token or a finish.
type simEvent struct {
	kind      string // "scrape", "route", "first", "finish"
	at        time.Duration
	addr      string // scrape: the endpoint; route: the pick
	metrics   engine.Metrics
	tag       int
	model     string
	prompt    []byte
	bodyBytes int64
	outcome   route.Outcome
}

// blockTokens is the engines' KV block; the prefix index's 64-character blocks
// stand for the same 16 tokens.
const (
	blockTokens    = 16
	blockChars     = prefix.DefaultBlockChars
	unhealthyAfter = 3 // scrapes never fail here; the gateway's default
)

// RunSim replays trace through a simulated fleet, each request routed by the
// policy at its arrival, and returns one record per request. The picker reads
// the engines only through simulated scrapes: every ScrapeInterval (±10%
// jitter) per endpoint, with the gateway's own dispatches since folded in by
// the same accounting `serve` uses.
func RunSim(ctx context.Context, opts SimOptions, trace workload.Trace) ([]report.Record, sim.Stats, error) {
	out, err := simulate(ctx, opts, trace)
	return out.recs, out.stats, err
}

// simOutput is what one run gives: a record per request, the engines' totals,
// and the most requests each endpoint had in flight at once, from all replicas.
type simOutput struct {
	recs        []report.Record
	stats       sim.Stats
	maxInFlight []int
}

func simulate(ctx context.Context, opts SimOptions, trace workload.Trace) (simOutput, error) {
	if opts.ScrapeInterval == 0 {
		opts.ScrapeInterval = 50 * time.Millisecond
	}
	if opts.StaleAfter == 0 {
		opts.StaleAfter = 2 * time.Second
	}
	if p, ok := benchProfile(opts.Policy); ok && opts.Profile == nil {
		opts.Profile = &p
	}
	servers, _, err := opts.Fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		return simOutput{}, err
	}
	r := &simRun{opts: opts, trace: trace, recs: make([]report.Record, len(trace)), routes: make([]*route.Route, len(trace)), server: make([]int, len(trace)),
		rng: rand.New(rand.NewPCG(opts.Seed, 0x5c4a)), byAddr: map[string]int{}, inFlight: make([]int, len(servers)), maxInFlight: make([]int, len(servers)),
		scraped: make([]bool, len(servers))}
	// A bench-side policy (kube-proxy, weighted-round-robin, oracle) picks the
	// engine itself: no routing core, no scrapes.
	bench := opts.Profile == nil && benchPolicy(opts.Policy)
	replicas := max(opts.Replicas, 1)
	if bench && replicas > 1 {
		return simOutput{}, fmt.Errorf("policy %q picks without a gateway: it has no replicas", opts.Policy)
	}
	var addrs []string
	for i, o := range servers {
		e, err := sim.New(o.Engine)
		if err != nil {
			return simOutput{}, fmt.Errorf("server %d: %w", i, err)
		}
		r.engines = append(r.engines, e)
		r.eps = append(r.eps, &simEndpoint{addr: fmt.Sprintf("sim-%d:8000", i), lora: len(o.LoRAModules) > 0 || o.Engine.MaxLoRAs > 0})
		r.byAddr[r.eps[i].addr] = i
		addrs = append(addrs, r.eps[i].addr)
		// Scrapers start at random phases, as independent goroutines would.
		if !bench {
			heap.Push(&r.scrapes, scrapeAt{at: time.Duration(r.rng.Int64N(int64(opts.ScrapeInterval))), ep: i})
		}
	}
	// The routing core `serve` runs, on the virtual clock, its metrics fed by
	// the simulated scrapes below instead of HTTP ones.
	cfg, err := simConfig(opts, trace, addrs)
	if err != nil {
		return simOutput{}, err
	}
	arrivals := simArrivals(trace)
	if !bench {
		shared := opts.Shared && replicas > 1
		if r.reps, err = newReplicas(opts, cfg, replicas, shared, func() time.Time { return epoch.Add(r.now) }); err != nil {
			return simOutput{}, err
		}
		defer func() {
			for _, rep := range r.reps {
				rep.router.Close()
			}
		}()
		r.replicaOf = spreadOver(trace, replicas, opts.Seed)
		if shared {
			if opts.SyncDelay < 0 || opts.SyncEvery < 0 {
				return simOutput{}, fmt.Errorf("negative sync delay %v or period %v", opts.SyncDelay, opts.SyncEvery)
			}
			r.sync = newPeerSync(r.reps, addrs, r.byAddr, opts.SyncDelay, opts.SyncEvery, arrivals[len(arrivals)-1].At, func() time.Duration { return r.now })
		}
	}
	for i, a := range arrivals {
		r.recs[i] = report.Record{Arrival: a.At, PromptTokens: a.Req.PromptTokens}
	}
	if bench {
		if r.pick, err = r.benchPicker(arrivals); err != nil {
			return simOutput{}, fmt.Errorf("policy %q: %w", opts.Policy, err)
		}
	}
	f := sim.NewFleet(r.engines)
	r.fleet = f
	f.OnFirstToken = func(i int, s *sim.Seq) {
		r.now = s.FirstToken
		if rt := r.routes[s.Req.Tag]; rt != nil {
			rt.FirstByte(http.StatusOK, true)
		}
		r.event(simEvent{kind: "first", tag: int(s.Req.Tag)})
	}
	// Scrapes are timed events: each reads its engine as it was at the scrape's
	// time, never ahead of it.
	f.Adapters = slices.ContainsFunc(r.eps, func(e *simEndpoint) bool { return e.lora })
	f.NextTick = r.nextTick
	f.OnTick = r.tick
	// A cancelled run stops routing (the rest are dropped) and lets the engines
	// drain what they hold, which takes no wall time to speak of.
	routed := 0
	if _, err := f.Run(arrivals, func(a sim.Arrival) int {
		if routed++; routed%1024 == 0 && ctx.Err() != nil {
			return -1
		}
		return r.route(ctx, a)
	}, r.finished); err != nil {
		return simOutput{}, err
	}
	if err := ctx.Err(); err != nil {
		return simOutput{}, err
	}
	if opts.probe != nil {
		opts.probe(r.server)
	}
	var total sim.Stats
	for _, e := range r.engines {
		st := e.Snapshot().Stats
		total.PromptTokens += st.PromptTokens
		total.GenerationTokens += st.GenerationTokens
		total.PrefixQueries += st.PrefixQueries
		total.PrefixHits += st.PrefixHits
		total.Preemptions += st.Preemptions
		total.LoRALoads += st.LoRALoads
	}
	return simOutput{recs: r.recs, stats: total, maxInFlight: r.maxInFlight}, nil
}

// simArrivals are the trace's requests as the engines receive them, tagged
// with their index in the trace.
func simArrivals(trace workload.Trace) []sim.Arrival {
	arrivals := make([]sim.Arrival, len(trace))
	answers := trace.Answers()
	var ids []uint64
	var text []byte
	for i, q := range trace {
		var req sim.Request
		req, ids, text = simRequest(q, i, answers[i], ids, text)
		arrivals[i] = sim.Arrival{At: time.Duration(q.At * float64(time.Second)), Req: req}
	}
	return arrivals
}

// simConfig is the InferenceGatewayConfig `serve` would run for the policy: one
// scheduler over the simulated endpoints, serving the trace's model and
// adapters, with the policy as its picker (a baseline) or its profile.
func simConfig(opts SimOptions, trace workload.Trace, addrs []string) (*v1alpha1.InferenceGatewayConfig, error) {
	if len(trace) == 0 {
		return nil, errors.New("empty trace")
	}
	sc := v1alpha1.SchedulerSpec{Name: "bench", ModelName: trace[0].Model, Endpoints: addrs}
	switch {
	case opts.Profile != nil: // kvgate's picker with the given profile
	case benchPolicy(opts.Policy): // picked by the bench; the config checks the trace
	case schedule.IsBaseline(opts.Policy):
		sc.Picker = opts.Policy
	default:
		if _, err := schedule.LookupProfile(opts.Policy); err != nil {
			return nil, fmt.Errorf("unknown policy %q", opts.Policy)
		}
		sc.Profile = opts.Policy
	}
	seen := map[string]bool{}
	for _, q := range trace {
		if q.Model != sc.ModelName {
			return nil, fmt.Errorf("the trace names models %q and %q: a simulated fleet serves one", sc.ModelName, q.Model)
		}
		if q.Adapter != "" && !seen[q.Adapter] {
			seen[q.Adapter] = true
			sc.LoRAAdapters = append(sc.LoRAAdapters, q.Adapter)
		}
	}
	cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{sc}}}
	cfg.APIVersion, cfg.Kind = v1alpha1.GroupVersion.String(), "InferenceGatewayConfig"
	cfg.Name = "bench"
	return cfg, nil
}

type simEndpoint struct {
	addr string
	lora bool
}

type simRun struct {
	opts  SimOptions
	trace workload.Trace
	// reps are the gateway replicas (none under a bench-side policy), and
	// replicaOf the one each request goes to.
	reps      []*replica
	replicaOf []int32
	// sync shares state between replicas (nil unless shared).
	sync *peerSync
	// pick, under a bench-side policy, picks the engine of each arrival.
	pick    func(sim.Arrival) int
	engines []*sim.Engine
	eps     []*simEndpoint
	scrapes scrapeHeap
	fleet   *sim.Fleet
	rng     *rand.Rand
	byAddr  map[string]int
	// now is the virtual time, the router's clock.
	now time.Duration

	recs   []report.Record
	routes []*route.Route // per request, from its pick to its end
	server []int          // per request: the engine serving it
	// inFlight counts each engine's requests from their pick to their end,
	// whichever replica picked them; maxInFlight is its highest.
	inFlight, maxInFlight []int
	scraped               []bool // per engine: scraped at least once

	// reused per request
	ids  []uint64
	text []byte
}

// epoch anchors virtual time for the router, which works in wall-clock times.
var epoch = time.Unix(1_700_000_000, 0)

// route is the gateway's decision for one arrival at virtual time a.At, made by
// the routing core from the prompt's text as `serve` reads it from a body.
func (r *simRun) route(ctx context.Context, a sim.Arrival) int {
	r.now = a.At
	tag := int(a.Req.Tag)
	q := r.trace[tag]
	// The head of the prompt the gateway's scanner hands over: the first 256
	// blocks.
	r.ids = workload.BlockIDs(r.ids[:0], q.Prompt, blockTokens)
	r.text = blockText(r.text[:0], r.ids[:min(len(r.ids), prefix.DefaultMaxBlocks)])
	model := q.Model
	if q.Adapter != "" {
		model = q.Adapter
	}
	if r.pick != nil {
		return r.routeBench(tag, model, a)
	}
	req := route.Request{Model: model, Prompt: r.text, BodyBytes: bodyBytes(model, a.Req.PromptTokens), Start: epoch.Add(a.At)}
	k := int(r.replicaOf[tag])
	rt, ref := r.reps[k].router.Route(ctx, req)
	if ref != nil {
		r.recs[tag].Error = true
		return -1
	}
	i := r.byAddr[rt.Endpoints[0]]
	r.event(simEvent{kind: "route", tag: tag, addr: rt.Endpoints[0], model: model, prompt: req.Prompt, bodyBytes: req.BodyBytes})
	// A prompt the server cannot hold is its 400, not a routing matter: the
	// gateway does not retry client errors.
	if a.Req.PromptTokens+a.Req.OutputTokens > r.engines[i].MaxModelLen() {
		r.finish(tag, rt, route.Outcome{Status: http.StatusBadRequest})
		r.recs[tag].Error = true
		return -1
	}
	r.routes[tag] = rt
	// The engine has the whole request as it is dispatched: its time to
	// first token runs from here, as serve's runs from the body's last byte.
	rt.Sent(rt.Endpoints[0])
	r.dispatched(tag, i)
	return i
}

// dispatched counts request tag in flight on engine i.
func (r *simRun) dispatched(tag, i int) {
	r.server[tag] = i
	r.inFlight[i]++
	r.maxInFlight[i] = max(r.maxInFlight[i], r.inFlight[i])
}

// routeBench routes an arrival by a bench-side policy, with the accounting of
// route but no routing core.
func (r *simRun) routeBench(tag int, model string, a sim.Arrival) int {
	i := max(r.pick(a), 0) // no engine holds it: the first refuses it below
	r.event(simEvent{kind: "route", tag: tag, addr: r.eps[i].addr, model: model, prompt: r.text,
		bodyBytes: bodyBytes(model, a.Req.PromptTokens)})
	if a.Req.PromptTokens+a.Req.OutputTokens > r.engines[i].MaxModelLen() {
		r.finish(tag, nil, route.Outcome{Status: http.StatusBadRequest})
		r.recs[tag].Error = true
		return -1
	}
	r.dispatched(tag, i)
	return i
}

// bodyBytes is the size of the body serve would read for a request: a streaming
// completions request whose prompt takes about four characters a token. The
// routing core estimates the prompt's tokens from it, as it does in serve.
func bodyBytes(model string, promptTokens int) int64 {
	return int64(len(`{"model":"","stream":true,"prompt":""}`) + len(model) + 4*promptTokens)
}

// nextTick is when the next timed event is due: a scrape, or shared state to
// deliver or publish.
func (r *simRun) nextTick() (time.Duration, bool) {
	t, ok := time.Duration(0), false
	if len(r.scrapes) > 0 {
		t, ok = r.scrapes[0].at, true
	}
	if r.sync != nil {
		if ts, due := r.sync.due(); due && (!ok || ts < t) {
			t, ok = ts, true
		}
	}
	return t, ok
}

// tick runs the timed event due at now, a scrape first.
func (r *simRun) tick(now time.Duration) {
	if len(r.scrapes) > 0 && r.scrapes[0].at <= now {
		r.scrape(now)
		return
	}
	r.now = now
	r.sync.tick(now)
}

// scrape runs the scrape due at now: the engine's gauges as they were at that
// moment, every replica reading the same, then schedules the endpoint's next
// one.
func (r *simRun) scrape(now time.Duration) {
	r.now = now
	s := heap.Pop(&r.scrapes).(scrapeAt)
	e, eng := r.eps[s.ep], r.engines[s.ep]
	g := r.fleet.GaugesAt(s.ep, now)
	cfg := eng.Config()
	m := engine.Metrics{Waiting: float64(g.Waiting), Running: float64(g.Running), KVUsage: g.KVUsage,
		BlockSize: blockTokens, NumBlocks: eng.NumBlocks()}
	if e.lora {
		m.HasLoRA, m.MaxLoRA, m.RunningAdapters, m.WaitingAdapters = true, max(1, cfg.MaxLoRAs), g.RunningAdapters, g.WaitingAdapters
	}
	for _, rep := range r.reps {
		rep.router.Observe(e.addr, m, engine.VLLM, epoch.Add(now))
	}
	r.scraped[s.ep] = true
	if r.sync != nil {
		r.sync.scraped(now, s.ep)
	}
	r.event(simEvent{kind: "scrape", addr: e.addr, metrics: m})
	iv := r.opts.ScrapeInterval
	next := s.at + iv + time.Duration((r.rng.Float64()-0.5)*0.2*float64(iv))
	heap.Push(&r.scrapes, scrapeAt{at: next, ep: s.ep})
}

func (r *simRun) finished(i int, s *sim.Seq) {
	tag := int(s.Req.Tag)
	r.now = s.Done
	r.inFlight[i]--
	rt := r.routes[tag]
	rec := &r.recs[tag]
	rec.CachedTokens = s.CachedTokens
	rec.OutputTokens = s.Generated
	if s.Finish == sim.FinishAbort || s.FirstToken == 0 {
		r.finish(tag, rt, route.Outcome{StreamError: true})
		rec.Error = true
		return
	}
	r.finish(tag, rt, route.Outcome{Status: http.StatusOK})
	rec.TTFT = s.FirstToken - s.Arrival
	rec.E2E = s.Done - s.Arrival
}

func (r *simRun) finish(tag int, rt *route.Route, o route.Outcome) {
	if rt != nil {
		rt.Finish(o)
	}
	r.routes[tag] = nil
	r.event(simEvent{kind: "finish", tag: tag, outcome: o})
}

// event passes an event to the test's recorder, if any.
func (r *simRun) event(e simEvent) {
	if r.opts.record != nil {
		e.at = r.now
		if e.prompt != nil {
			e.prompt = bytes.Clone(e.prompt)
		}
		r.opts.record(e)
	}
}

// blockText appends one 64-character block of text per block identity: what the
// gateway would read of a prompt whose 16-token blocks have these identities.
func blockText(dst []byte, ids []uint64) []byte {
	var b [8]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint64(b[:], id)
		for range blockChars / 16 {
			dst = hex.AppendEncode(dst, b[:])
		}
	}
	return dst
}

type scrapeAt struct {
	at time.Duration
	ep int
}

type scrapeHeap []scrapeAt

func (h scrapeHeap) Len() int           { return len(h) }
func (h scrapeHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h scrapeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *scrapeHeap) Push(x any)        { *h = append(*h, x.(scrapeAt)) }
func (h *scrapeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
