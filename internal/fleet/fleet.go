// Package fleet keeps a live view of model-server endpoints: one scraper per
// endpoint reads its metrics (internal/engine), tracks staleness and health, and
// the gateway's own dispatches between two scrapes are counted on top, so that a
// burst arriving between scrapes does not herd onto the pod that looked idle.
package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

// Config tunes the scrapers; zero fields take the defaults.
type Config struct {
	Interval       time.Duration // between scrapes; default 50 ms
	Timeout        time.Duration // of one scrape; default 1 s
	StaleAfter     time.Duration // metrics older than this are stale; default 2 s
	UnhealthyAfter int           // consecutive failures that make an endpoint unhealthy; default 3
	BlockSize      int           // tokens per KV block when the server does not say; default 16
	Now            func() time.Time
	// External: nothing is scraped; the endpoints' metrics arrive by Observe
	// (the virtual-time benchmark, whose engines are in process).
	External bool
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = 50 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = time.Second
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = 2 * time.Second
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = 3
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// maxExposition bounds how much of a /metrics answer is read.
const maxExposition = 8 << 20

// Snapshot is an endpoint as the picker sees it: the last scrape with the
// gateway's own dispatches since then folded in.
type Snapshot struct {
	Address string
	engine.Metrics
	Dialect  engine.Dialect
	Scraped  bool          // at least one scrape succeeded
	Age      time.Duration // since the last successful scrape
	Stale    bool
	Healthy  bool
	Failures int
	// Unreachable: every scrape since the last success failed without an
	// answer (and one did): the process is gone or frozen.
	Unreachable bool
	LastError   string
	// Pending counts requests dispatched after the last scrape and not yet
	// reflected in it; they are included in Waiting and KVUsage above.
	Pending int
	// PrefillTokens are the prompt tokens this gateway sent that await their
	// first token.
	PrefillTokens int
	// PrefillWork is the part of PrefillTokens the endpoint was not expected
	// to hold cached: the prefill it has to compute.
	PrefillWork int
	// ScrapeErrors counts failed scrapes since the endpoint was added.
	ScrapeErrors uint64
}

// Fleet scrapes a set of endpoints until they are removed.
type Fleet struct {
	cfg     atomic.Pointer[Config]
	sharing atomic.Pointer[Sharing]

	mu        sync.RWMutex
	endpoints map[string]*endpoint
}

// New builds an empty fleet.
func New(cfg Config) *Fleet {
	f := &Fleet{endpoints: map[string]*endpoint{}}
	f.SetConfig(cfg)
	return f
}

// SetConfig retunes the scrapers from their next scrape on; a zero Now keeps the
// current one.
func (f *Fleet) SetConfig(cfg Config) {
	if old := f.cfg.Load(); old != nil {
		if cfg.Now == nil {
			cfg.Now = old.Now
		}
	}
	cfg = cfg.withDefaults()
	f.cfg.Store(&cfg)
}

// Target is an endpoint to scrape and the metric map its exposition is read
// with (nil detects a built-in one; engine.MapFor builds it from a scheduler).
type Target struct {
	Addr string
	Map  *engine.Map
	// TLS, when set, scrapes the endpoint over TLS (appProtocol https).
	TLS ClientTLS
}

// ClientTLS gives the TLS configuration of each new connection to an
// endpoint, so that what it checks (a CA bundle reread as it rotates) may
// change from one connection to the next. A configuration returned is the
// caller's to change.
type ClientTLS interface {
	ClientConfig(addr string) *tls.Config
}

type endpoint struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	want  *engine.Map // configured; nil detects
	tls   ClientTLS   // configured; nil scrapes over plain HTTP
	acct  Accounting
	peers Load // the other replicas' (SetPeerLoad)
	// heard is when a scrape's result last came, this replica's or a peer's
	// (the local clock).
	heard time.Time
}

// PendingGrace is how long before a scrape a dispatch must have been sent for the
// scrape to be trusted to count it: about one engine step.
const PendingGrace = 50 * time.Millisecond

// Accounting is one endpoint as the picker sees it: its last scrape, with the
// gateway's own dispatches since folded in. It is not safe for concurrent use: the
// Fleet guards each one, and the virtual-time benchmark drives it directly with
// its own clock, so both run the same accounting.
type Accounting struct {
	Metrics   engine.Metrics
	Dialect   engine.Dialect // of the last successful scrape
	ScrapedAt time.Time      // when the last successful scrape began; zero before
	Failures  int            // consecutive failed scrapes
	// Unanswered counts the consecutive failed scrapes that got no answer.
	Unanswered int
	Errors     uint64 // failed scrapes in all
	LastErr    error
	pending    []dispatch // dispatched after the last scrape began
	completed  int        // completions of requests dispatched before the last scrape
	// started counts first tokens, since the last scrape, of requests dispatched
	// before it: no longer queued, whatever the scrape said.
	started int
	nextID  uint64
	// prefilling holds the prompt tokens of dispatched requests whose first token
	// has not come back: work queued ahead of a new request, which the gateway
	// knows before any scrape does.
	prefilling      map[uint64]prefill
	prefillingTotal int
	prefillingWork  int
}

// prefill is a dispatched prompt awaiting its first token: its tokens, and
// those of them not expected to be cached.
type prefill struct{ tokens, work int }

// Observed records a successful scrape that began at started.
func (a *Accounting) Observed(m engine.Metrics, d engine.Dialect, started time.Time) {
	a.Metrics, a.Dialect, a.Failures, a.Unanswered, a.LastErr = m, d, 0, 0, nil
	a.ScrapedAt = started
	// Dispatches well before the scrape began are in the server's numbers now. A
	// model server updates its gauges once a step, so a request that arrived in
	// the step running when the scrape came is not counted yet: for PendingGrace
	// a dispatch stays counted by the gateway too (briefly twice rather than not
	// at all, which would draw the next requests to that server).
	kept := a.pending[:0]
	for _, p := range a.pending {
		if p.at.After(started.Add(-PendingGrace)) {
			kept = append(kept, p)
		}
	}
	a.pending = kept
	a.completed, a.started = 0, 0
}

// Failed records a failed scrape.
func (a *Accounting) Failed(err error) {
	a.Failures++
	a.Errors++
	if IsUnreachable(err) {
		a.Unanswered++
	} else {
		a.Unanswered = 0
	}
	a.LastErr = err
}

// Dispatch records a request of promptTokens sent at at, of which work are
// not expected to be cached; blockSize is the KV block size to assume when the
// server does not export one. The id goes to Complete.
func (a *Accounting) Dispatch(at time.Time, promptTokens, work, blockSize int) uint64 {
	if bs := a.Metrics.BlockSize; bs > 0 {
		blockSize = bs
	}
	a.nextID++
	a.pending = append(a.pending, dispatch{id: a.nextID, at: at, blocks: (promptTokens + blockSize - 1) / blockSize})
	if a.prefilling == nil {
		a.prefilling = map[uint64]prefill{}
	}
	work = min(max(work, 0), promptTokens)
	a.prefilling[a.nextID] = prefill{promptTokens, work}
	a.prefillingTotal += promptTokens
	a.prefillingWork += work
	return a.nextID
}

// FirstToken records that the request of a dispatch id produced its first token:
// its prompt is no longer work ahead of others.
func (a *Accounting) FirstToken(id uint64) {
	p, ok := a.prefilling[id]
	if !ok {
		return
	}
	delete(a.prefilling, id)
	a.prefillingTotal -= p.tokens
	a.prefillingWork -= p.work
	for i := range a.pending {
		if a.pending[i].id == id {
			a.pending[i].started = true
			return
		}
	}
	a.started++
}

// Complete records that the request of a dispatch id finished.
func (a *Accounting) Complete(id uint64) {
	a.FirstToken(id)
	for i, p := range a.pending {
		if p.id == id {
			a.pending = append(a.pending[:i], a.pending[i+1:]...)
			return
		}
	}
	// Dispatched before the last scrape: the server still counts it as running
	// until its next scrape.
	a.completed++
}

// Load is what one gateway replica adds to an endpoint's last scrape: its
// dispatches since, and its prompts awaiting a first token. Replicas that
// share state publish theirs (Accounting.Load) and fold their peers' in
// (SnapshotWith), so that a burst spread over them does not herd.
type Load struct {
	// Queued and Started count the dispatches after the last scrape, before
	// and after their first token; Blocks their prompts' KV blocks.
	Queued, Started, Blocks int
	// StartedBefore and Completed count first tokens and completions, since
	// the last scrape, of requests dispatched before it.
	StartedBefore, Completed int
	// PrefillTokens and PrefillWork are the prompt tokens, and of them those
	// not expected cached, of dispatches awaiting their first token.
	PrefillTokens, PrefillWork int
}

// Add sums two loads.
func (l Load) Add(o Load) Load {
	return Load{Queued: l.Queued + o.Queued, Started: l.Started + o.Started, Blocks: l.Blocks + o.Blocks,
		StartedBefore: l.StartedBefore + o.StartedBefore, Completed: l.Completed + o.Completed,
		PrefillTokens: l.PrefillTokens + o.PrefillTokens, PrefillWork: l.PrefillWork + o.PrefillWork}
}

// Load is this accounting's own share of the endpoint's load.
func (a *Accounting) Load() Load {
	l := Load{StartedBefore: a.started, Completed: a.completed, PrefillTokens: a.prefillingTotal, PrefillWork: a.prefillingWork}
	for _, p := range a.pending {
		l.Blocks += p.blocks
		if p.started {
			l.Started++
		} else {
			l.Queued++
		}
	}
	return l
}

// Snapshot folds the dispatches into the last scrape, as of now.
func (a *Accounting) Snapshot(addr string, now time.Time, staleAfter time.Duration, unhealthyAfter int) Snapshot {
	return a.SnapshotWith(addr, now, staleAfter, unhealthyAfter, Load{})
}

// SnapshotWith is Snapshot with other replicas' loads (peers) added to this
// one's.
func (a *Accounting) SnapshotWith(addr string, now time.Time, staleAfter time.Duration, unhealthyAfter int, peers Load) Snapshot {
	l := a.Load().Add(peers)
	s := Snapshot{Address: addr, Metrics: a.Metrics, Dialect: a.Dialect, Scraped: !a.ScrapedAt.IsZero(), Failures: a.Failures, Unreachable: a.Failures > 0 && a.Unanswered == a.Failures, Pending: l.Queued + l.Started,
		PrefillTokens: l.PrefillTokens, PrefillWork: l.PrefillWork, ScrapeErrors: a.Errors}
	if a.LastErr != nil {
		s.LastError = a.LastErr.Error()
	}
	// Dispatched but not yet seen by the server: queued until their first token,
	// then running, holding their prompt's blocks. Of those the scrape counted, a
	// first token since takes one out of the queue (so a queue read just before
	// a burst drained does not hold for a whole scrape interval; one that was
	// already prefilling is taken from the queue instead of running, the total
	// still right), and a completion takes one out of the batch.
	moved := min(s.Waiting, float64(l.StartedBefore))
	s.Waiting += float64(l.Queued) - moved
	s.Running = max(0, s.Running+moved-float64(l.Completed)) + float64(l.Started)
	if s.NumBlocks > 0 {
		s.KVUsage = min(1, s.KVUsage+float64(l.Blocks)/float64(s.NumBlocks))
	}
	if s.Scraped {
		s.Age = now.Sub(a.ScrapedAt)
	}
	s.Stale = !s.Scraped || s.Age > staleAfter
	s.Healthy = s.Scraped && s.Failures < unhealthyAfter
	return s
}

type dispatch struct {
	id      uint64
	at      time.Time
	blocks  int
	started bool // its first token came back
}

// Ticket identifies one dispatch, for Completed.
type Ticket struct {
	addr string
	id   uint64
}

// Sync makes the fleet scrape exactly targets: scrapers start for new addresses
// and stop, with their state purged, for addresses that left; a changed metric
// map or TLS applies from the next scrape.
func (f *Fleet) Sync(ctx context.Context, targets []Target) {
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		want[t.Addr] = t
	}
	f.mu.Lock()
	var stopped []*endpoint
	for a, e := range f.endpoints {
		if _, ok := want[a]; !ok {
			e.cancel()
			stopped = append(stopped, e)
			delete(f.endpoints, a)
		}
	}
	for a, t := range want {
		if e, ok := f.endpoints[a]; ok {
			e.mu.Lock()
			e.want, e.tls = t.Map, t.TLS
			e.mu.Unlock()
			continue
		}
		ectx, cancel := context.WithCancel(ctx)
		e := &endpoint{addr: a, cancel: cancel, done: make(chan struct{}), want: t.Map, tls: t.TLS}
		f.endpoints[a] = e
		if f.cfg.Load().External {
			close(e.done)
			continue
		}
		go f.scrapeLoop(ectx, e)
	}
	f.mu.Unlock()
	for _, e := range stopped {
		<-e.done
	}
}

// Close stops every scraper.
func (f *Fleet) Close() { f.Sync(context.Background(), nil) }

func (f *Fleet) scrapeLoop(ctx context.Context, e *endpoint) {
	defer close(e.done)
	sc := newScrapeConn(e.addr)
	defer sc.close()
	// A fleet that stops aborts a scrape in progress rather than wait it out.
	defer context.AfterFunc(ctx, sc.close)()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		cfg := f.cfg.Load()
		e.mu.Lock()
		wait := backoff(cfg.Interval, cfg.StaleAfter, e.acct.Failures)
		heard := e.heard
		e.mu.Unlock()
		// Another replica scrapes it and publishes the result: this one
		// scrapes only when that has been silent past two of its waits.
		if sh := f.sharing.Load(); sh == nil || sh.Owns(e.addr) || time.Since(heard) > 2*wait+TakeoverSlack {
			if err := f.scrape(ctx, e, sc, cfg, sh); err != nil {
				e.mu.Lock()
				wait = backoff(cfg.Interval, cfg.StaleAfter, e.acct.Failures)
				e.mu.Unlock()
			} else {
				wait = cfg.Interval
			}
		}
		// ±10% jitter keeps a gateway's scrapers from firing in lockstep.
		wait += time.Duration((rng.Float64() - 0.5) * 0.2 * float64(wait))
		timer.Reset(wait)
	}
}

// TakeoverSlack is added to two scrape waits before a replica scrapes an
// endpoint its peer is assigned but has published nothing for.
const TakeoverSlack = 100 * time.Millisecond

// Sharing assigns the scraping of endpoints among gateway replicas: each is
// scraped by the replica Owns names, which publishes the result for the
// others to ObserveResult; one whose owner goes silent is scraped locally.
type Sharing struct {
	Owns    func(addr string) bool
	Publish func(addr string, r Result)
}

// SetSharing shares the scraping with other replicas (nil: every endpoint is
// scraped here).
func (f *Fleet) SetSharing(s *Sharing) { f.sharing.Store(s) }

// Result is one scrape's outcome as a replica publishes it.
type Result struct {
	Started time.Time
	Metrics engine.Metrics
	Dialect engine.Dialect
	// Err is the failure ("" on success); Unreachable says it got no answer.
	Err         string
	Unreachable bool
}

// peerFailure is a failed scrape another replica published.
type peerFailure string

func (p peerFailure) Error() string { return string(p) }

// ObserveResult applies a scrape result another replica published; an
// address the fleet does not hold is ignored.
func (f *Fleet) ObserveResult(addr string, r Result) {
	e := f.get(addr)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.heard = time.Now()
	switch {
	case r.Err == "":
		e.acct.Observed(r.Metrics.Bounded(), r.Dialect, r.Started)
	case r.Unreachable:
		e.acct.Failed(unreachable{peerFailure(r.Err)})
	default:
		e.acct.Failed(peerFailure(r.Err))
	}
}

func backoff(interval, staleAfter time.Duration, failures int) time.Duration {
	wait := interval
	for i := 1; i < failures && wait < staleAfter/2; i++ {
		wait *= 2
	}
	return min(wait, max(interval, staleAfter/2))
}

func (f *Fleet) scrape(ctx context.Context, e *endpoint, sc *scrapeConn, cfg *Config, sh *Sharing) error {
	started := cfg.Now()
	m, d, err := fetch(e, sc, cfg.Timeout)
	e.mu.Lock()
	if err != nil && ctx.Err() != nil {
		e.mu.Unlock()
		return err // the fleet is stopping
	}
	e.heard = time.Now()
	r := Result{Started: started}
	if err != nil {
		e.acct.Failed(err)
		r.Err, r.Unreachable = err.Error(), IsUnreachable(err)
	} else {
		e.acct.Observed(m, d, started)
		r.Metrics, r.Dialect = m, d
	}
	e.mu.Unlock()
	if sh != nil && sh.Publish != nil {
		sh.Publish(e.addr, r)
	}
	return err
}

var exposition = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func fetch(e *endpoint, sc *scrapeConn, timeout time.Duration) (engine.Metrics, engine.Dialect, error) {
	buf := exposition.Get().(*bytes.Buffer)
	defer exposition.Put(buf)
	buf.Reset()
	e.mu.Lock()
	m, tc := e.want, e.tls
	e.mu.Unlock()
	if err := sc.get(timeout, buf, tc); err != nil {
		return engine.Metrics{}, "", err
	}
	return m.Parse(buf)
}

// Dispatched records that the gateway sent a request of promptTokens to addr,
// work of them not expected to be cached there; the ticket goes to Completed
// when the request ends.
func (f *Fleet) Dispatched(addr string, promptTokens, work int) Ticket {
	e := f.get(addr)
	if e == nil {
		return Ticket{}
	}
	cfg := f.cfg.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	return Ticket{addr: addr, id: e.acct.Dispatch(cfg.Now(), promptTokens, work, cfg.BlockSize)}
}

// Observe records metrics read from addr by a scrape that began at started, as
// the fleet's own scrapers do; an address the fleet does not hold is ignored.
func (f *Fleet) Observe(addr string, m engine.Metrics, d engine.Dialect, started time.Time) {
	if e := f.get(addr); e != nil {
		e.mu.Lock()
		e.acct.Observed(m, d, started)
		e.mu.Unlock()
	}
}

// FirstToken records that the request of a ticket produced its first byte of
// response: its prefill is done.
func (f *Fleet) FirstToken(t Ticket) { f.update(t, (*Accounting).FirstToken) }

// Completed records that the request of a ticket finished.
func (f *Fleet) Completed(t Ticket) { f.update(t, (*Accounting).Complete) }

// update applies a ticket's event to its endpoint's accounting, if the endpoint
// is still in the fleet.
func (f *Fleet) update(t Ticket, event func(*Accounting, uint64)) {
	e := f.get(t.addr)
	if e == nil || t.id == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	event(&e.acct, t.id)
}

func (f *Fleet) get(addr string) *endpoint {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.endpoints[addr]
}

// Snapshot returns one entry per address, in order, so callers can index it
// alongside addrs; an address the fleet does not scrape reads as never scraped
// (stale, unhealthy).
func (f *Fleet) Snapshot(addrs []string) []Snapshot {
	return f.AppendSnapshots(nil, addrs)
}

// AppendSnapshots is Snapshot appending to dst, for callers that reuse memory.
func (f *Fleet) AppendSnapshots(dst []Snapshot, addrs []string) []Snapshot {
	cfg := f.cfg.Load()
	now := cfg.Now()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, a := range addrs {
		if e := f.endpoints[a]; e != nil {
			dst = append(dst, e.snapshot(now, cfg))
		} else {
			dst = append(dst, Snapshot{Address: a, Stale: true})
		}
	}
	return dst
}

func (e *endpoint) snapshot(now time.Time, cfg *Config) Snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.acct.SnapshotWith(e.addr, now, cfg.StaleAfter, cfg.UnhealthyAfter, e.peers)
}

// SetPeerLoad sets what the other gateway replicas add to addr's load: their
// Loads summed. An address the fleet does not hold is ignored.
func (f *Fleet) SetPeerLoad(addr string, l Load) {
	if e := f.get(addr); e != nil {
		e.mu.Lock()
		e.peers = l
		e.mu.Unlock()
	}
}

// Loads calls fn with this replica's own Load of every endpoint, for its
// peers.
func (f *Fleet) Loads(fn func(addr string, l Load)) {
	f.mu.RLock()
	eps := make([]*endpoint, 0, len(f.endpoints))
	for _, e := range f.endpoints {
		eps = append(eps, e)
	}
	f.mu.RUnlock()
	for _, e := range eps {
		e.mu.Lock()
		l := e.acct.Load()
		e.mu.Unlock()
		fn(e.addr, l)
	}
}
