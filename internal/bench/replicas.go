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
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

// Gateway replicas in virtual time (issue 20): several kvgate replicas behind
// one Kubernetes Service, each with its own routing core (picker, prefix index,
// dispatch accounting per endpoint), all reading the same scrapes. Unshared,
// each knows only the requests it routed itself. Shared, each also applies its
// peers' state as it was SyncDelay ago: their routing decisions, recorded in
// its prefix index, and their loads on each endpoint since its last scrape,
// added to its own (fleet.Fleet.SetPeerLoad).
//
// Loads are modelled as the live system is to share them: every replica
// publishes its own loads every SyncEvery of virtual time (those that
// changed; with SyncEvery 0, at each change), and each publication reaches the
// peers SyncDelay later; a decision reaches them SyncDelay after it was made.
// Learned speeds, error rates and sessions stay each replica's own.

// The live system's sharing, as `kvgate bench` models it by default: state
// reaches the other replicas DefaultSyncDelay late (through Redis), loads
// published every DefaultSyncEvery.
const (
	DefaultSyncDelay = 3 * time.Millisecond
	DefaultSyncEvery = 2 * time.Millisecond
)

// replica is one gateway replica of a run.
type replica struct {
	router *route.Router
	// fleet and index are the router's own, reached to share state (shared
	// runs only).
	fleet *fleet.Fleet
	index *prefix.Index
	// dirty marks the endpoints whose load this replica changed since it last
	// published; published holds what it published last, by endpoint.
	dirty     []bool
	published []fleet.Load
	// peers holds the loads received from each peer, by endpoint.
	peers [][]fleet.Load
}

// newReplicas builds n routers on the run's clock, each with cfg applied.
// shared reaches into each one's fleet and index for peerSync. The replicas
// share a seed, as `kvgate serve` replicas started alike do.
func newReplicas(opts SimOptions, cfg *v1alpha1.InferenceGatewayConfig, n int, shared bool, now func() time.Time) ([]*replica, error) {
	reps := make([]*replica, 0, n)
	closeAll := func() {
		for _, r := range reps {
			r.router.Close()
		}
	}
	endpoints := len(cfg.Spec.Schedulers[0].Endpoints)
	for range n {
		rt := route.New(route.Options{Logger: slog.New(slog.DiscardHandler), Seed: opts.Seed, Profile: opts.Profile,
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
		var err error
		if rep.fleet, rep.index, err = routerState(rt); err != nil {
			closeAll()
			return nil, err
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
}

// endpointLoad is a replica's own load on endpoint ep.
type endpointLoad struct {
	ep   int
	load fleet.Load
}

func newPeerSync(reps []*replica, addrs []string, byAddr map[string]int, delay, every, until time.Duration) *peerSync {
	p := &peerSync{reps: reps, addrs: addrs, byAddr: byAddr, delay: delay, every: every, until: until, loads: make([]fleet.Load, len(addrs))}
	if every == 0 {
		p.next = never // until something changes
	}
	return p
}

// due is the time of the next thing to do: a delivery or a publication.
func (p *peerSync) due() (time.Duration, bool) {
	if p.head < len(p.queue) {
		return min(p.queue[p.head].at, p.next), true
	}
	return p.next, p.next <= p.until
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

// decided shares replica from's decision: the prompt's block hashes it
// recorded for addr in its prefix index, with that endpoint's capacity.
func (p *peerSync) decided(now time.Duration, from int, addr string, hashes []uint64, capacity int) {
	if len(hashes) > 0 {
		p.send(now, syncMsg{from: from, addr: addr, hashes: hashes, capacity: capacity})
	}
}

// changed marks endpoint ep's load as changed by replica k at now.
func (p *peerSync) changed(now time.Duration, k, ep int) {
	p.reps[k].dirty[ep] = true
	p.changes(now)
}

// scraped marks endpoint ep's load as changed by a scrape at now, which every
// replica observes.
func (p *peerSync) scraped(now time.Duration, ep int) {
	for _, r := range p.reps {
		r.dirty[ep] = true
	}
	p.changes(now)
}

// changes makes a change at now published at once when every change is.
func (p *peerSync) changes(now time.Duration) {
	if p.every == 0 {
		p.next = min(p.next, now)
	}
}

// publish sends each replica's loads that changed since its last publication.
func (p *peerSync) publish(now time.Duration) {
	for k, r := range p.reps {
		if !slices.Contains(r.dirty, true) {
			continue
		}
		// Loads reports in no set order; the scratch is by endpoint.
		r.fleet.Loads(func(addr string, l fleet.Load) { p.loads[p.byAddr[addr]] = l })
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
}

// deliver applies a message to every replica but its sender.
func (p *peerSync) deliver(m *syncMsg) {
	for j, r := range p.reps {
		if j == m.from {
			continue
		}
		if m.loads == nil {
			r.index.Record(m.addr, m.hashes, m.capacity)
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
			r.fleet.SetPeerLoad(p.addrs[el.ep], sum)
		}
	}
}

// promptBlocks works out what a decision recorded in the deciding replica's
// prefix index, as route does, to send it to the peers: the prompt head's
// block hashes, seeded by model and adapter, and the chosen endpoint's
// capacity in blocks (its KV cache over about four characters a token once
// scraped, the configured default before).
type promptBlocks struct {
	model                 string
	blockChars, maxBlocks int
	unknown               int // capacity of an endpoint never scraped
}

func newPromptBlocks(sc v1alpha1.SchedulerSpec) promptBlocks {
	return promptBlocks{model: sc.ModelName, blockChars: sc.PrefixBlockChars(), maxBlocks: sc.PrefixMaxBlocks(), unknown: sc.PrefixCapacity()}
}

func (b promptBlocks) hashes(q workload.Request, text []byte) []uint64 {
	return prefix.Hashes(nil, text, b.blockChars, b.maxBlocks, prefix.Seed(b.model, q.Adapter))
}

func (b promptBlocks) capacity(scraped bool, e *sim.Engine) int {
	if !scraped {
		return b.unknown
	}
	return max(1, e.NumBlocks()*blockTokens*4/b.blockChars)
}
