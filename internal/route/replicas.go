package route

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
)

// Peers is the link to the other replicas of this gateway (peers.Mesh): the
// router tells it its decisions and that its loads changed; it applies the
// peers' through the router's peers.State methods below.
type Peers interface {
	Decided(d peers.Decision)
	Touch()
	// Owns says whether this replica scrapes an endpoint; Scraped publishes
	// a scrape's result for the others.
	Owns(addr string) bool
	Scraped(addr string, r fleet.Result)
	// Ejected tells the others of an outlier ejection; Answered of what an
	// answer taught of an endpoint's speed.
	Ejected(addr string, until time.Time)
	Answered(a peers.Answer)
	// Settled is the time up to which this replica's changes are in every
	// peer's view and theirs before it in its own (peers.Mesh.Settled).
	Settled() time.Time
}

// replicaShare is this replica's place among the live ones: its rank in
// their sorted names and their number, itself included.
type replicaShare struct{ rank, replicas int }

var _ peers.State = (*Router)(nil)

// SetPeers links the router to its peers; nil unlinks it. Call it before
// serving.
func (g *Router) SetPeers(p Peers) {
	if p == nil {
		g.fleet.SetSharing(nil)
		g.peers.Store(nil)
		return
	}
	g.peers.Store(&p)
	g.fleet.SetSharing(&fleet.Sharing{Owns: p.Owns, Publish: p.Scraped})
}

// PeerEjection implements peers.State: a peer ejected the pod at addr until
// then; every scheduler here that routes to it ejects it as long, unless that
// would eject more than its policy's share of its endpoints (it fails open,
// as for its own ejections).
func (g *Router) PeerEjection(addr string, until time.Time) {
	rt := g.routes.Load()
	if rt == nil {
		return
	}
	now := g.now()
	for _, p := range rt.schedulers {
		e := p.endpoint(addr)
		if e == nil || e.ejected(now) && e.out.until.Load() >= until.UnixNano() {
			continue
		}
		ejected := 0
		for _, o := range p.endpoints {
			if o.ejected(now) {
				ejected++
			}
		}
		if !e.ejected(now) && float64(ejected+1) > p.outliers.maxShare*float64(len(p.endpoints)) {
			continue
		}
		e.out.until.Store(until.UnixNano())
		g.log.Info("endpoint ejected by a peer replica", "scheduler", p.name, "endpoint", addr, "until", until)
	}
}

// PeerAnswer implements peers.State: a peer's answer teaches the endpoint's
// speed here as this replica's own would, so that every replica learns from
// all the answers, not its share of them.
func (g *Router) PeerAnswer(a peers.Answer) {
	rt := g.routes.Load()
	if rt == nil {
		return
	}
	now := g.now()
	for _, p := range rt.schedulers {
		e := p.endpoint(a.Endpoint)
		if e == nil {
			continue
		}
		if a.Step {
			e.speed.ObserveStep(a.Running, a.Seconds, p.poolSpeed())
			continue
		}
		e.speed.ObserveTTFT(a.Own, a.Ahead, a.Running, a.Loads, a.Seconds, p.poolSpeed())
		e.taught(now, false, false)
		p.observedAt.Store(now.UnixNano())
		p.refreshPrior(now)
	}
}

// answeredSpeed tells the peers what an answer taught of an endpoint's speed.
func (g *Router) answeredSpeed(a peers.Answer) {
	if p := g.mesh(); p != nil {
		p.Answered(a)
	}
}

// PeerScrape implements peers.State: a peer's scrape of an endpoint stands
// for this replica's own.
func (g *Router) PeerScrape(addr string, r fleet.Result) { g.fleet.ObserveResult(addr, r) }

func (g *Router) mesh() Peers {
	if p := g.peers.Load(); p != nil {
		return *p
	}
	return nil
}

// touch tells the peers this replica's loads changed.
func (g *Router) touch() {
	if p := g.mesh(); p != nil {
		p.Touch()
	}
}

// record notes a decision in the prefix index and tells the peers.
func (g *Router) record(addr string, hashes []uint64, capacity int) {
	g.prefix.Record(addr, hashes, capacity)
	if p := g.mesh(); p != nil {
		p.Decided(peers.Decision{Endpoint: addr, Capacity: capacity, Hashes: hashes})
	}
}

// EachLoad implements peers.State: this replica's load on every endpoint, with
// its requests in flight there (over every scheduler that has it).
func (g *Router) EachLoad(fn func(addr string, l peers.Load)) {
	inFlight := map[string]int{}
	g.mu.Lock()
	for _, e := range g.endpoints {
		inFlight[e.addr] += int(e.inFlight.Load())
	}
	g.mu.Unlock()
	g.fleet.Loads(func(addr string, l fleet.Load) { fn(addr, peers.Load{Load: l, InFlight: inFlight[addr]}) })
}

// SetPeerLoad implements peers.State: the peers' load on an endpoint adds to
// this replica's view of it.
func (g *Router) SetPeerLoad(addr string, l peers.Load) {
	g.fleet.SetPeerLoad(addr, l.Load)
	g.mu.Lock()
	for _, e := range g.endpoints {
		if e.addr == addr {
			e.peers.Store(int64(l.InFlight))
		}
	}
	g.mu.Unlock()
}

// PeerDecision implements peers.State: a peer's decision feeds the prefix
// index, for an endpoint a scheduler of this replica routes to and with
// prefix affinity, within that scheduler's bounds: at most its maxBlocks, in
// an index the size this replica gives the endpoint (what a peer says of
// the size is not taken: a forged one could grow the index without bound).
func (g *Router) PeerDecision(d peers.Decision) {
	rt := g.routes.Load()
	if len(d.Hashes) == 0 || rt == nil {
		return
	}
	for _, p := range rt.schedulers {
		if p.prefix.blockChars == 0 || p.endpoint(d.Endpoint) == nil {
			continue
		}
		capacity := p.prefix.capacity
		if s := g.fleet.Snapshot([]string{d.Endpoint})[0]; s.Scraped {
			capacity = p.prefix.capacityOf(s.Metrics)
		}
		g.prefix.Record(d.Endpoint, d.Hashes[:min(len(d.Hashes), p.prefix.maxBlocks)], capacity)
		return
	}
}

// SetReplicas implements peers.State: this replica's rank among the live
// replicas, and their number.
func (g *Router) SetReplicas(rank, replicas int) {
	g.share.Store(&replicaShare{rank: rank, replicas: max(replicas, 1)})
}

// slots is a per-endpoint in-flight limit as this replica applies it: its
// part of the limit, always its own, and the limit itself, whose slots the
// other replicas' last reports leave free it may borrow.
type slots struct {
	part, limit int
	// peers tells when this replica's view settled (Peers.Settled): a
	// replica borrows a slot of an endpoint only once its last slot there is
	// in a settled view, so that the borrow is made on a view that holds its
	// own last requests and its peers' up to then, and each replica has at
	// most one borrow there its peers have not seen. Read at each look: a
	// request waiting to borrow waits for the view to settle.
	peers Peers
}

// settled is when this replica's view last settled, Unix nanoseconds (0:
// never, or no peers).
func (s slots) settled() int64 {
	if s.peers == nil {
		return 0
	}
	if t := s.peers.Settled(); !t.IsZero() {
		return t.UnixNano()
	}
	return 0
}

// room says whether an endpoint with n of this replica's requests in flight,
// and peers of the others', may take one more (a zero limit: always), and
// whether it would be a borrow (past this replica's part).
func (s slots) room(n, peers int) (ok, borrow bool) {
	switch {
	case s.limit <= 0 || n < s.part:
		return true, false
	case n+peers < s.limit:
		return true, true
	}
	return false, false
}

// borrowPoll is how often a request waiting to borrow looks whether this
// replica's view has settled.
const borrowPoll = 2 * time.Millisecond

// admits says whether e may take one more request under limit now, and, when
// not, whether it may in a borrow window.
func (e *endpoint) admits(limit slots, now time.Time) (ok, soon bool) {
	ok, borrow := limit.room(int(e.inFlight.Load()), int(e.peers.Load()))
	if ok && borrow && e.admittedAt.Load() >= limit.settled() {
		return false, true
	}
	return ok, false
}

// refusal is the 429's message when no endpoint had room.
func (s slots) refusal(model string) string {
	if s.part < s.limit {
		return fmt.Sprintf("every endpoint of model %q is at its limit of %d requests in flight over the gateway's replicas (this replica's part: %d); retry later", model, s.limit, s.part)
	}
	return fmt.Sprintf("every endpoint of model %q is at its limit of %d requests in flight; retry later", model, s.limit)
}

// slots splits a per-endpoint in-flight limit among the live replicas: each
// one's part is limit / replicas, one more for the first limit % replicas by
// rank, at least one (0: no limit). Alone, its part is the whole limit.
func (g *Router) slots(limit int) slots {
	s := g.share.Load()
	if limit <= 0 || s == nil || s.replicas <= 1 {
		return slots{part: limit, limit: limit}
	}
	q := limit / s.replicas
	if s.rank < limit%s.replicas {
		q++
	}
	return slots{part: max(q, 1), limit: limit, peers: g.mesh()}
}

// InFlightPart is this replica's part of the configuration's
// maxInFlightPerEndpoint (0: no limit).
func (g *Router) InFlightPart() int {
	rt := g.routes.Load()
	if rt == nil {
		return 0
	}
	return g.slots(rt.gw.InFlightLimit()).part
}

// Share reports this replica's rank and the live replicas' number (1 alone).
func (g *Router) Share() (rank, replicas int) {
	if s := g.share.Load(); s != nil {
		return s.rank, s.replicas
	}
	return 0, 1
}
