// Package bench runs kvgate's scheduler against simulated model servers — in
// virtual time, with the same picker, prefix index and in-flight accounting as
// `kvgate serve` — and against live OpenAI-compatible endpoints, and compares
// policies scenario by scenario.
package bench

import (
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Policies are the routing policies a benchmark compares: the baselines users
// would otherwise run, GIE's default weights, and kvgate's profiles ("kvgate" is
// the profile a scheduler gets when it names none).
var Policies = []string{"round-robin", "least-request", "random", "power-of-two", "gie-default", "kvgate", "chat", "batch"}

// SimOptions configure one virtual-time run.
type SimOptions struct {
	Fleet  simserver.FleetSpec
	Policy string
	// Profile, when set, replaces the policy's weights (kvgate tune).
	Profile *schedule.Profile
	// ScrapeInterval and StaleAfter are the gateway's (defaults 50 ms and 2 s).
	ScrapeInterval, StaleAfter time.Duration
	Seed                       uint64
	// probe, in tests, receives the server each request was routed to.
	probe func(server []int)
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
	if opts.ScrapeInterval == 0 {
		opts.ScrapeInterval = 50 * time.Millisecond
	}
	if opts.StaleAfter == 0 {
		opts.StaleAfter = 2 * time.Second
	}
	servers, _, err := opts.Fleet.Options(slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, sim.Stats{}, err
	}
	adapters := slices.ContainsFunc(trace, func(r workload.Request) bool { return r.Adapter != "" })
	picker, usesPrefix, err := newPicker(opts, adapters)
	if err != nil {
		return nil, sim.Stats{}, err
	}
	r := &simRun{opts: opts, picker: picker, usesPrefix: usesPrefix, index: prefix.New(),
		recs: make([]report.Record, len(trace)), ticket: make([]uint64, len(trace)), server: make([]int, len(trace)),
		rng: rand.New(rand.NewPCG(opts.Seed, 0x5c4a)), byAddr: map[string]int{}}
	for i, o := range servers {
		e, err := sim.New(o.Engine)
		if err != nil {
			return nil, sim.Stats{}, fmt.Errorf("server %d: %w", i, err)
		}
		r.engines = append(r.engines, e)
		r.eps = append(r.eps, &simEndpoint{addr: fmt.Sprintf("sim-%d:8000", i), lora: len(o.LoRAModules) > 0 || o.Engine.MaxLoRAs > 0})
		r.byAddr[r.eps[i].addr] = i
		// Scrapers start at random phases, as independent goroutines would.
		heap.Push(&r.scrapes, scrapeAt{at: time.Duration(r.rng.Int64N(int64(opts.ScrapeInterval))), ep: i})
	}
	arrivals := make([]sim.Arrival, len(trace))
	var ids []uint64
	var text []byte
	for i, q := range trace {
		// The prompt as text of one 64-character block per 16-token block, hashed
		// by the gateway's own prefix code: the engine caches these hashes, and the
		// gateway's index, seeded alike, matches on the first 256 of them.
		ids = workload.BlockIDs(ids[:0], q.Prompt, blockTokens)
		text = blockText(text[:0], ids)
		hashes := prefix.Hashes(nil, text, blockChars, len(ids), prefix.Seed(q.Model, q.Adapter))
		at := time.Duration(q.At * float64(time.Second))
		arrivals[i] = sim.Arrival{At: at, Req: sim.Request{PromptTokens: q.PromptTokens(), BlockHashes: hashes,
			OutputTokens: max(1, q.OutputTokens), IgnoreEOS: true, Adapter: q.Adapter, Tag: uint64(i)}}
		r.recs[i] = report.Record{Arrival: at, PromptTokens: q.PromptTokens()}
	}
	f := sim.NewFleet(r.engines)
	r.fleet = f
	f.OnFirstToken = func(i int, s *sim.Seq) { r.eps[i].acct.FirstToken(r.ticket[s.Req.Tag]) }
	// Scrapes are timed events: each reads its engine as it was at the scrape's
	// time, never ahead of it.
	f.Adapters = slices.ContainsFunc(r.eps, func(e *simEndpoint) bool { return e.lora })
	f.NextTick = func() (time.Duration, bool) {
		if len(r.scrapes) == 0 {
			return 0, false
		}
		return r.scrapes[0].at, true
	}
	f.OnTick = r.scrape
	// A cancelled run stops routing (the rest are dropped) and lets the engines
	// drain what they hold, which takes no wall time to speak of.
	routed := 0
	if _, err := f.Run(arrivals, func(a sim.Arrival) int {
		if routed++; routed%1024 == 0 && ctx.Err() != nil {
			return -1
		}
		return r.route(a, trace[a.Req.Tag])
	}, r.finished); err != nil {
		return nil, sim.Stats{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, sim.Stats{}, err
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
	return r.recs, total, nil
}

// newPicker builds the policy's picker as `serve` builds a scheduler's, and says
// whether it scores prefix affinity.
func newPicker(opts SimOptions, adapters bool) (schedule.Picker, bool, error) {
	if opts.Profile == nil {
		if schedule.IsBaseline(opts.Policy) {
			p, err := schedule.New(opts.Policy, opts.Seed)
			return p, false, err
		}
	}
	pr := schedule.Profile{}
	if opts.Profile != nil {
		pr = *opts.Profile
	} else {
		var err error
		if pr, err = schedule.LookupProfile(opts.Policy); err != nil {
			return nil, false, fmt.Errorf("unknown policy %q", opts.Policy)
		}
	}
	if adapters {
		pr = pr.WithAdapters()
	}
	return schedule.NewWeighted(pr, schedule.Thresholds{}, opts.Seed), pr.Weights["prefix"] > 0, nil
}

type simEndpoint struct {
	addr     string
	lora     bool
	acct     fleet.Accounting
	inFlight int
}

type simRun struct {
	opts       SimOptions
	picker     schedule.Picker
	usesPrefix bool
	index      *prefix.Index
	engines    []*sim.Engine
	eps        []*simEndpoint
	scrapes    scrapeHeap
	fleet      *sim.Fleet
	rng        *rand.Rand
	byAddr     map[string]int

	recs   []report.Record
	ticket []uint64 // per request: its dispatch id
	server []int    // per request: the engine serving it

	// reused per request
	cands []schedule.Endpoint
	addrs []string
	match []int
}

// epoch anchors virtual time for the accounting, which works in wall-clock times.
var epoch = time.Unix(1_700_000_000, 0)

// route is the gateway's decision for one arrival at virtual time a.At.
func (r *simRun) route(a sim.Arrival, q workload.Request) int {
	now := a.At
	// The hashes of the prompt's head, as the gateway computes them from the
	// first 256 blocks its scanner hands over.
	var hashes []uint64
	if r.usesPrefix {
		hashes = a.Req.BlockHashes[:min(len(a.Req.BlockHashes), prefix.DefaultMaxBlocks)]
	}
	r.cands, r.addrs = r.cands[:0], r.addrs[:0]
	wall := epoch.Add(now)
	for _, e := range r.eps {
		s := e.acct.Snapshot(e.addr, wall, r.opts.StaleAfter, unhealthyAfter)
		r.cands = append(r.cands, schedule.Endpoint{Address: e.addr, InFlight: e.inFlight,
			Signals: schedule.Signals{Metrics: s.Metrics, HasMetrics: s.Scraped, Healthy: s.Healthy, Stale: s.Stale, PrefillTokens: float64(s.PrefillTokens)}})
		r.addrs = append(r.addrs, e.addr)
	}
	if len(hashes) > 0 {
		r.match = slices.Grow(r.match[:0], len(r.addrs))[:len(r.addrs)]
		r.index.Match(hashes, r.addrs, r.match)
		for i, n := range r.match {
			r.cands[i].PrefixMatch = float64(n) / float64(len(hashes))
		}
	}
	req := schedule.Request{Model: q.Model, Adapter: q.Adapter}
	d := r.picker.Pick(req, r.cands)
	i := r.indexOf(d.Ranked[0].Address)
	e, eng := r.eps[i], r.engines[i]
	tag := int(a.Req.Tag)
	// A prompt the server cannot hold is its 400, not a routing matter: the
	// gateway does not retry client errors.
	if a.Req.PromptTokens+a.Req.OutputTokens > eng.MaxModelLen() {
		r.recs[tag].Error = true
		return -1
	}
	r.ticket[tag] = e.acct.Dispatch(wall, a.Req.PromptTokens, blockTokens)
	r.server[tag] = i
	e.inFlight++
	if len(hashes) > 0 {
		c := eng.NumBlocks() * blockTokens * 4 / blockChars
		r.index.Record(e.addr, hashes, c)
	}
	return i
}

func (r *simRun) indexOf(addr string) int { return r.byAddr[addr] }

// scrape runs the scrape due at now: the engine's gauges as they were at that
// moment, then schedules the endpoint's next one.
func (r *simRun) scrape(now time.Duration) {
	s := heap.Pop(&r.scrapes).(scrapeAt)
	e, eng := r.eps[s.ep], r.engines[s.ep]
	g := r.fleet.GaugesAt(s.ep, now)
	cfg := eng.Config()
	m := engine.Metrics{Waiting: float64(g.Waiting), Running: float64(g.Running), KVUsage: g.KVUsage,
		BlockSize: blockTokens, NumBlocks: eng.NumBlocks()}
	if e.lora {
		m.HasLoRA, m.MaxLoRA, m.RunningAdapters, m.WaitingAdapters = true, max(1, cfg.MaxLoRAs), g.RunningAdapters, g.WaitingAdapters
	}
	e.acct.Observed(m, engine.VLLM, epoch.Add(now))
	iv := r.opts.ScrapeInterval
	next := s.at + iv + time.Duration((r.rng.Float64()-0.5)*0.2*float64(iv))
	heap.Push(&r.scrapes, scrapeAt{at: next, ep: s.ep})
}

func (r *simRun) finished(i int, s *sim.Seq) {
	tag := int(s.Req.Tag)
	e := r.eps[i]
	e.acct.Complete(r.ticket[tag])
	e.inFlight--
	rec := &r.recs[tag]
	rec.CachedTokens = s.CachedTokens
	rec.OutputTokens = s.Generated
	if s.Finish == sim.FinishAbort || s.FirstToken == 0 {
		rec.Error = true
		return
	}
	rec.TTFT = s.FirstToken - s.Arrival
	rec.E2E = s.Done - s.Arrival
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
