package route

import (
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
	// Ejected tells the others of an outlier ejection.
	Ejected(addr string, until time.Time)
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
	if l.InFlight == 0 {
		delete(g.peerInFlight, addr)
	} else {
		g.peerInFlight[addr] = l.InFlight
	}
	g.mu.Unlock()
}

// PeerDecision implements peers.State: a peer's decision feeds the prefix
// index, for an endpoint this replica routes to.
func (g *Router) PeerDecision(d peers.Decision) {
	if len(d.Hashes) == 0 || !g.fleet.Has(d.Endpoint) {
		return
	}
	g.prefix.Record(d.Endpoint, d.Hashes, d.Capacity)
}

// SetReplicas implements peers.State: this replica's rank among the live
// replicas, and their number.
func (g *Router) SetReplicas(rank, replicas int) {
	g.share.Store(&replicaShare{rank: rank, replicas: max(replicas, 1)})
}

// quota is this replica's part of a per-endpoint in-flight limit: the limit
// split among the live replicas, the remainder to the first ranks, at least
// one each (0: no limit).
func (g *Router) quota(limit int) int {
	s := g.share.Load()
	if limit <= 0 || s == nil || s.replicas <= 1 {
		return limit
	}
	q := limit / s.replicas
	if s.rank < limit%s.replicas {
		q++
	}
	return max(q, 1)
}

// Share reports this replica's rank and the live replicas' number (1 alone).
func (g *Router) Share() (rank, replicas int) {
	if s := g.share.Load(); s != nil {
		return s.rank, s.replicas
	}
	return 0, 1
}
