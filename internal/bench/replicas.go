package bench

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/workload"
)

// Gateway replicas in virtual time: several kvgate replicas behind
// one Kubernetes Service, each with its own routing core (picker, prefix index,
// dispatch accounting per endpoint), all reading the same scrapes. Unshared,
// each knows only the requests it routed itself. Shared, each also applies its
// peers' state as it was SyncDelay ago: their routing decisions, recorded in
// its prefix index, and their loads on each endpoint since its last scrape,
// added to its own (fleet.Fleet.SetPeerLoad).
//
// Sharing is modelled as the live system shares (peers.Mesh): with SyncEvery
// 0, each replica sends what changed (its decisions, what its answers taught
// of speeds, its loads) at the change, or, within peers.DefaultFlush of its
// last send, gathered until then; each send reaches the peers SyncDelay
// later. With SyncEvery above 0, decisions and answers go at once and loads
// every SyncEvery. Error rates and sessions stay each replica's own.

// The live system's sharing, as `kvgate bench` models it by default: sends
// gathered as the mesh gathers them, each reaching the other replicas
// DefaultSyncDelay late, the propagation through Redis of a decision sent at
// once (BenchmarkPropagation in internal/peers, sparse: p50 0.49 ms, p99 2.9
// ms; docs/scaling.md). The suite sweeps longer delays beside it.
const (
	DefaultSyncDelay = 500 * time.Microsecond
	DefaultSyncEvery = 0
)

// replica is one gateway replica of a run.
type replica struct {
	router *route.Router
	// dirty marks the endpoints whose load this replica changed since it last
	// published; published holds what it published last, by endpoint.
	dirty     []bool
	published []fleet.Load
	// peers holds the loads received from each peer, by endpoint.
	peers [][]fleet.Load
	// Gathering (peerSync.flush): the decisions and answers waiting for the
	// replica's next send, when that is due (never: nothing waits), and when
	// it last sent.
	outbox   []syncMsg
	sendAt   time.Duration
	lastSend time.Duration
}

// newReplicas builds n routers on the run's clock, each with cfg applied and
// its own seed. Shared, each gets the bookkeeping peerSync fills;
// newPeerSync then links them.
func newReplicas(opts SimOptions, cfg *v1alpha1.InferenceGatewayConfig, n int, shared bool, now func() time.Time) ([]*replica, error) {
	reps := make([]*replica, 0, n)
	closeAll := func() {
		for _, r := range reps {
			r.router.Close()
		}
	}
	endpoints := len(cfg.Spec.Schedulers[0].Endpoints)
	for k := range n {
		// Each its own seed, as kvgate serve draws one at start (the first
		// the run's, so one replica is the single-replica run).
		rt := route.New(route.Options{Logger: slog.New(slog.DiscardHandler), Seed: opts.Seed + uint64(k)*0x9e3779b97f4a7c15, Profile: opts.Profile,
			Fleet: fleet.Config{Interval: opts.ScrapeInterval, StaleAfter: opts.StaleAfter, UnhealthyAfter: unhealthyAfter, BlockSize: blockTokens,
				Now: now, External: true}})
		rep := &replica{router: rt}
		reps = append(reps, rep)
		if err := rt.Apply(cfg); err != nil {
			closeAll()
			return nil, fmt.Errorf("policy %q: %w", opts.Policy, err)
		}
		if !shared {
			continue
		}
		rep.dirty, rep.published = make([]bool, endpoints), make([]fleet.Load, endpoints)
		rep.peers = make([][]fleet.Load, n)
		for k := range rep.peers {
			rep.peers[k] = make([]fleet.Load, endpoints)
		}
	}
	return reps, nil
}

// spreadOver assigns each request of the trace to one of n replicas as a
// Kubernetes Service spreads connections: kube-proxy gives each connection a
// backend at random and a client keeps its connection, so the requests of one
// client (a conversation, a shared-prefix user: the trace's Session) go to the
// replica its identity hashes to; a request with no identity goes to one drawn
// at random. Seeded, so runs reproduce.
func spreadOver(trace workload.Trace, n int, seed uint64) []int32 {
	out := make([]int32, len(trace))
	if n <= 1 {
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x7265706c))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	for i, q := range trace {
		if q.Session == "" {
			out[i] = int32(rng.IntN(n))
			continue
		}
		h := fnv.New64a()
		_, _ = h.Write(b[:])
		_, _ = h.Write([]byte(q.Session))
		out[i] = int32(h.Sum64() % uint64(n))
	}
	return out
}

// peerSync delivers shared state between the replicas of a run, SyncDelay
// late. With a constant delay, messages fall due in the order they are sent,
// so a FIFO holds them.
type peerSync struct {
	reps         []*replica
	addrs        []string
	byAddr       map[string]int
	delay, every time.Duration
	// flush is the least time between two sends of a replica (0: none):
	// peers.DefaultFlush when each change is sent after a delay.
	flush time.Duration
	// until is the trace's last arrival: what would arrive later changes no
	// decision, so it is not sent (a huge delay then costs nothing).
	until time.Duration
	next  time.Duration // the next publication; never when none is due
	queue []syncMsg
	head  int
	// scratch for a replica's loads, by endpoint
	loads []fleet.Load
}

// syncMsg is a decision (addr, hashes, capacity) or a publication (loads) of
// replica from, due at at.
type syncMsg struct {
	at       time.Duration
	from     int
	addr     string
	hashes   []uint64
	capacity int
	loads    []endpointLoad
	answer   *peers.Answer
}

// endpointLoad is a replica's own load on endpoint ep.
type endpointLoad struct {
	ep   int
	load fleet.Load
}

// newPeerSync links the replicas as the live system does (route.Peers): each
// router tells its link of its decisions and load changes at the moment it
// makes them, on the run's clock now.
func newPeerSync(reps []*replica, addrs []string, byAddr map[string]int, delay, every, until time.Duration, now func() time.Duration) *peerSync {
	p := &peerSync{reps: reps, addrs: addrs, byAddr: byAddr, delay: delay, every: every, until: until, loads: make([]fleet.Load, len(addrs))}
	if every == 0 {
		p.next = never // until something changes
		if delay > 0 {
			p.flush = peers.DefaultFlush
		}
	}
	for _, r := range reps {
		r.sendAt, r.lastSend = never, -p.flush
	}
	for k, r := range reps {
		r.router.SetPeers(&link{p: p, k: k, now: now})
	}
	return p
}

// link is a replica's route.Peers in virtual time: what the router reports
// goes through peerSync, SyncDelay late.
type link struct {
	p   *peerSync
	k   int
	now func() time.Duration
}

// Decided shares a decision; the router reuses the hashes' memory.
func (l *link) Decided(d peers.Decision) {
	l.p.decided(l.now(), l.k, d.Endpoint, slices.Clone(d.Hashes), d.Capacity)
}

// Touch marks the replica's loads changed; the publication sends those that
// did.
func (l *link) Touch() {
	for e := range l.p.reps[l.k].dirty {
		l.p.reps[l.k].dirty[e] = true
	}
	l.p.changes(l.now(), l.k)
}

// Every replica reads the same scrapes (the bench's), and ejections are not
// modelled.
func (*link) Owns(string) bool             { return true }
func (*link) Scraped(string, fleet.Result) {}
func (*link) Ejected(string, time.Time)    {}

// Settled: what a replica published reaches everyone the delay later.
func (l *link) Settled() time.Time { return epoch.Add(l.now() - l.p.delay) }

// Answered shares what an answer taught the replica of an endpoint's speed.
func (l *link) Answered(a peers.Answer) { l.p.post(l.now(), syncMsg{from: l.k, answer: &a}) }

// due is the time of the next thing to do: a delivery or a publication.
func (p *peerSync) due() (time.Duration, bool) {
	next := p.next
	for _, r := range p.reps {
		next = min(next, r.sendAt)
	}
	if p.head < len(p.queue) {
		return min(p.queue[p.head].at, next), true
	}
	return next, next <= p.until
}

// tick runs what is due at now: deliveries first, then a publication.
func (p *peerSync) tick(now time.Duration) {
	for p.head < len(p.queue) && p.queue[p.head].at <= now {
		p.deliver(&p.queue[p.head])
		p.queue[p.head] = syncMsg{}
		p.head++
	}
	if p.head == len(p.queue) {
		p.queue, p.head = p.queue[:0], 0
	}
	for k, r := range p.reps {
		if r.sendAt <= now {
			for _, m := range r.outbox {
				p.send(now, m)
			}
			clear(r.outbox)
			r.outbox = r.outbox[:0]
			p.publishOne(now, k)
			r.sendAt, r.lastSend = never, now
		}
	}
	if p.next <= now {
		p.publish(now)
		p.next = now + p.every
		if p.every == 0 {
			p.next = never
		}
	}
}

// send queues a message to every other replica, due delay after now.
func (p *peerSync) send(now time.Duration, m syncMsg) {
	m.at = now + p.delay
	if m.at > p.until {
		return
	}
	p.queue = append(p.queue, m)
}

// post sends m from its replica at once, or, gathering, with the replica's
// next send.
func (p *peerSync) post(now time.Duration, m syncMsg) {
	if p.flush == 0 {
		p.send(now, m)
		return
	}
	r := p.reps[m.from]
	r.outbox = append(r.outbox, m)
	p.sendSoon(now, m.from)
}

// sendSoon makes replica k send at now, or a flush after its last send.
func (p *peerSync) sendSoon(now time.Duration, k int) {
	if r := p.reps[k]; r.sendAt == never {
		r.sendAt = max(now, r.lastSend+p.flush)
	}
}

// decided shares replica from's decision: the prompt's block hashes it
// recorded for addr in its prefix index, with that endpoint's capacity.
func (p *peerSync) decided(now time.Duration, from int, addr string, hashes []uint64, capacity int) {
	if len(hashes) > 0 {
		p.post(now, syncMsg{from: from, addr: addr, hashes: hashes, capacity: capacity})
	}
}

// scraped marks endpoint ep's load as changed by a scrape at now, which every
// replica observes.
func (p *peerSync) scraped(now time.Duration, ep int) {
	for k, r := range p.reps {
		r.dirty[ep] = true
		p.changes(now, k)
	}
}

// changes makes a change of replica k's at now published at once when every
// change is, or with its next send when sends gather.
func (p *peerSync) changes(now time.Duration, k int) {
	switch {
	case p.flush > 0:
		p.sendSoon(now, k)
	case p.every == 0:
		p.next = min(p.next, now)
	}
}

// publish sends each replica's loads that changed since its last publication.
func (p *peerSync) publish(now time.Duration) {
	for k := range p.reps {
		p.publishOne(now, k)
	}
}

// publishOne sends replica k's loads that changed since its last publication.
func (p *peerSync) publishOne(now time.Duration, k int) {
	r := p.reps[k]
	if !slices.Contains(r.dirty, true) {
		return
	}
	// EachLoad reports in no set order; the scratch is by endpoint.
	r.router.EachLoad(func(addr string, l peers.Load) { p.loads[p.byAddr[addr]] = l.Load })
	var out []endpointLoad
	for e, d := range r.dirty {
		if d && p.loads[e] != r.published[e] {
			out = append(out, endpointLoad{ep: e, load: p.loads[e]})
			r.published[e] = p.loads[e]
		}
		r.dirty[e] = false
	}
	if len(out) > 0 {
		p.send(now, syncMsg{from: k, loads: out})
	}
}

// deliver applies a message to every replica but its sender.
func (p *peerSync) deliver(m *syncMsg) {
	for j, r := range p.reps {
		if j == m.from {
			continue
		}
		if m.answer != nil {
			r.router.PeerAnswer(*m.answer)
			continue
		}
		if m.loads == nil {
			r.router.PeerDecision(peers.Decision{Endpoint: m.addr, Capacity: m.capacity, Hashes: m.hashes})
			continue
		}
		for _, el := range m.loads {
			r.peers[m.from][el.ep] = el.load
			var sum fleet.Load
			for k := range p.reps {
				if k != j {
					sum = sum.Add(r.peers[k][el.ep])
				}
			}
			r.router.SetPeerLoad(p.addrs[el.ep], peers.Load{Load: sum})
		}
	}
}
