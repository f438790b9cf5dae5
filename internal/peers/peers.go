// Package peers shares routing state among the replicas of one kvgate
// deployment through Redis, so that R replicas route as well as one: each
// replica publishes its routing decisions (for the prefix index) and its load
// on every endpoint past the last scrape (for the dispatch accounting) as
// batched entries of one Redis stream, and applies its peers'. Replicas find
// each other by heartbeats in a sorted set. With Redis down or slow every
// replica goes on with its own state; nothing on a request's path waits for
// Redis.
package peers

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/fleet"
)

// Config is how a replica reaches its peers; zero fields take the defaults.
type Config struct {
	// Addr is Redis's host:port.
	Addr               string
	Username, Password string
	TLS                *tls.Config
	DB                 int
	// Cluster is the identity the replicas share: the stream's and the
	// members' keys are named by it, and a message carrying another is
	// dropped (counted as foreign).
	Cluster string
	// Replica names this replica (default: the host name and a random
	// suffix, unique per start).
	Replica string
	// Flush is the least time between two sends (default 2 ms): an event
	// after a quiet spell goes at once, the events of a busy one gather, so
	// a replica writes Redis at most 500 times a second.
	Flush time.Duration
	// Heartbeat (default 1 s) is how often a replica announces itself and
	// sends all of its loads; a peer silent for Expiry (default 5 s) is gone
	// and its loads no longer count.
	Heartbeat, Expiry time.Duration
	// Retain is how many entries the stream keeps (approximately; default
	// 100,000): what a starting replica replays to warm its prefix index.
	Retain int64
	// MaxMessage bounds an entry read (default 1 MiB); larger ones are
	// dropped, counted as oversized.
	MaxMessage int
	// Timeout bounds each Redis call (default 1 s).
	Timeout    time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Replica == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		c.Replica = host + "-" + hex.EncodeToString(b[:])
	}
	if c.Flush <= 0 {
		c.Flush = DefaultFlush
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = time.Second
	}
	if c.Expiry <= 0 {
		c.Expiry = 5 * c.Heartbeat
	}
	if c.Retain <= 0 {
		c.Retain = 100_000
	}
	if c.MaxMessage <= 0 {
		c.MaxMessage = 1 << 20
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// DefaultFlush is Config.Flush's default.
const DefaultFlush = 2 * time.Millisecond

// State is the replica's routing state, as the router holds it.
type State interface {
	// EachLoad calls fn with this replica's own load on every endpoint.
	EachLoad(fn func(addr string, l Load))
	// SetPeerLoad sets what the live peers add to an endpoint's load.
	SetPeerLoad(addr string, l Load)
	// PeerDecision records a peer's decision in the prefix index.
	PeerDecision(d Decision)
	// SetReplicas gives this replica's rank among the live replicas (their
	// names sorted) and their number, itself included.
	SetReplicas(rank, replicas int)
	// PeerScrape applies a scrape another replica published.
	PeerScrape(addr string, r fleet.Result)
	// PeerEjection applies an outlier ejection another replica made, until
	// the time it ends.
	PeerEjection(addr string, until time.Time)
	// PeerAnswer teaches the endpoint's learned speed what a peer's answer
	// taught the peer's.
	PeerAnswer(a Answer)
}

// maxPending bounds the decisions waiting to be sent while Redis is away:
// past it the oldest go (counted), rather than memory growing. maxPeers bounds
// the peers a replica keeps; maxEjection how long a peer's ejection may last
// here (the longest outlier detection makes: 10 × 1 h).
const (
	maxPending       = 8192
	maxPendingHashes = 1 << 20
	maxPeers         = 256
	maxEjection      = 10 * time.Hour
)

var errDuplicateName = errors.New("two replicas share one name; give each its own (--replica-name, $POD_NAME)")

// sendBatch is the size a batch is split at; readBatch how many entries a read
// takes (each at most MaxMessage, so a read holds at most 64 MiB).
const (
	sendBatch = 256 << 10
	readBatch = 64
)

// Mesh is one replica's link to its peers. Decided and Touch are safe for
// concurrent use and never block.
type Mesh struct {
	cfg     Config
	cluster uint64
	// instance tells this start of the replica from another of the same
	// name: a restart (its earlier decisions are replayed) or a second
	// replica misconfigured with the name (logged).
	instance uint64
	rdb      *redis.Client
	state    State
	m        metrics
	stream   string
	members  string

	mu            sync.Mutex
	pending       []Decision
	pendingHashes int
	dropped       int
	scrapes       map[string]fleet.Result // to publish, the latest per endpoint
	ejects        map[string]time.Time    // to publish
	answers       []Answer                // to publish, at most maxPending

	// live names the live replicas, this one included, sorted (Owns).
	live atomic.Pointer[[]string]

	dirty atomic.Bool
	up    atomic.Bool
	wake  chan struct{}
	// sent lists this replica's last entries, in stream order, with when
	// their batch was gathered; settled is the gathering time of the last
	// one read back (Unix nanoseconds): Settled.
	sentMu  sync.Mutex
	sent    []sentEntry
	ownRead string // the last own entry read back
	settled atomic.Int64

	peersMu sync.Mutex
	peers   map[string]*peer
	sums    map[string]Load // applied to the state, by endpoint

	logMu  sync.Mutex
	logged time.Time

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// peer is what a replica knows of another.
type peer struct {
	seen     time.Time // last message or heartbeat
	listed   bool      // it was among the members: gone once it no longer is
	loads    map[string]Load
	lag      time.Duration // of its last message, by the two clocks
	messages uint64
	bytes    uint64
}

// New connects a mesh; Start runs it.
func New(cfg Config, state State) *Mesh {
	cfg = cfg.withDefaults()
	var inst [8]byte
	_, _ = rand.Read(inst[:])
	m := &Mesh{cfg: cfg, cluster: identity(cfg.Cluster), instance: binary.LittleEndian.Uint64(inst[:]), state: state, m: newMetrics(cfg.Registerer),
		stream: "kvgate:{" + cfg.Cluster + "}:events", members: "kvgate:{" + cfg.Cluster + "}:replicas",
		peers: map[string]*peer{}, sums: map[string]Load{}, wake: make(chan struct{}, 1)}
	m.rdb = redis.NewClient(&redis.Options{Addr: cfg.Addr, Username: cfg.Username, Password: cfg.Password, DB: cfg.DB, TLSConfig: cfg.TLS,
		DialTimeout: cfg.Timeout, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout, MaxRetries: -1, PoolSize: 4})
	return m
}

// Replica is this replica's name.
func (m *Mesh) Replica() string { return m.cfg.Replica }

// Start runs the mesh until Close: the sender, the reader (which first
// replays the stream's retained decisions into the prefix index) and the
// heartbeat.
func (m *Mesh) Start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.done.Add(3)
	go func() { defer m.done.Done(); m.sendLoop(ctx) }()
	go func() { defer m.done.Done(); m.readLoop(ctx) }()
	go func() { defer m.done.Done(); m.heartbeatLoop(ctx) }()
}

// Close stops the mesh and leaves the members' set, so that peers drop this
// replica's loads at once.
func (m *Mesh) Close() {
	if m.cancel != nil {
		m.cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Timeout)
	defer cancel()
	_ = m.rdb.ZRem(ctx, m.members, m.cfg.Replica).Err()
	// Closing the client ends a blocking read at once, even against a frozen
	// Redis (the read's own timeout is the block plus 10 s).
	_ = m.rdb.Close()
	m.done.Wait()
}

// Decided queues a routing decision for the peers.
func (m *Mesh) Decided(d Decision) {
	m.mu.Lock()
	h := slices.Clone(d.Hashes[:min(len(d.Hashes), maxHashes)])
	m.pending = append(m.pending, Decision{Endpoint: d.Endpoint, Capacity: d.Capacity, Hashes: h})
	m.pendingHashes += len(h)
	m.trimPending()
	m.mu.Unlock()
	m.Touch()
}

// trimPending drops the oldest decisions past maxPending of them or
// maxPendingHashes of their hashes (8 MiB); mu is held.
func (m *Mesh) trimPending() {
	drop := 0
	for drop < len(m.pending) && (len(m.pending)-drop > maxPending || m.pendingHashes > maxPendingHashes) {
		m.pendingHashes -= len(m.pending[drop].Hashes)
		drop++
	}
	m.pending = m.pending[drop:]
	m.dropped += drop
}

// Touch says this replica's loads changed: they go with the next batch.
func (m *Mesh) Touch() {
	if !m.dirty.Swap(true) {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// warn logs an engine failure at most every 30 s.
func (m *Mesh) warn(msg string, err error) {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	if time.Since(m.logged) < 30*time.Second {
		return
	}
	m.logged = time.Now()
	m.cfg.Logger.Warn(msg+"; routing on this replica's own state", "redis", m.cfg.Addr, "err", err)
}

func (m *Mesh) setUp(up bool) {
	if m.up.Swap(up) != up {
		if up {
			m.cfg.Logger.Info("shared state: connected", "redis", m.cfg.Addr, "replica", m.cfg.Replica)
			m.Touch()
		}
	}
	m.m.up.Set(b2f(up))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// sendLoop sends, at most every Flush, the queued decisions and the loads
// that changed since they were last sent; all loads every heartbeat.
func (m *Mesh) sendLoop(ctx context.Context) {
	sent := map[string]Load{}
	full := time.NewTicker(m.cfg.Heartbeat)
	defer full.Stop()
	var enc encoder
	var last time.Time
	for {
		all := false
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-full.C:
			all = true
		}
		// The first event after a quiet spell goes at once; events in a busy
		// spell gather for up to Flush after the last send, so a burst goes as
		// a few entries (at most one per Flush) rather than one per request.
		if wait := m.cfg.Flush - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		collected := last // what changed before now goes in this batch
		m.dirty.Store(false)
		m.mu.Lock()
		decisions, scrapes, ejects, answers := m.pending, m.scrapes, m.ejects, m.answers
		m.pending, m.scrapes, m.ejects, m.answers, m.pendingHashes = nil, nil, nil, nil, 0
		m.mu.Unlock()
		loads := map[string]Load{}
		m.state.EachLoad(func(addr string, l Load) {
			if all || sent[addr] != l {
				loads[addr] = l
			}
		})
		for addr := range sent {
			if _, ok := loads[addr]; !ok && all {
				delete(sent, addr) // an endpoint that left
			}
		}
		if len(decisions) == 0 && len(loads) == 0 && len(scrapes) == 0 && len(ejects) == 0 && len(answers) == 0 {
			continue
		}
		if err := m.send(ctx, &enc, batch{decisions, loads, scrapes, ejects, answers, all, collected}); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.setUp(false)
			m.warn("shared state: sending to Redis failed", err)
			m.m.messages.WithLabelValues("send_failed").Inc()
			// The loads go again in full once Redis answers; decisions made
			// meanwhile are kept up to maxPending.
			clear(sent)
			m.mu.Lock()
			for a, u := range ejects { // an ejection still matters when Redis is back
				if m.ejects == nil {
					m.ejects = map[string]time.Time{}
				}
				m.ejects[a] = u
			}
			m.pending = append(decisions, m.pending...)
			for _, d := range decisions {
				m.pendingHashes += len(d.Hashes)
			}
			m.trimPending()
			m.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			m.Touch()
			continue
		}
		maps.Copy(sent, loads)
	}
}

// batch is what one send carries.
type batch struct {
	decisions []Decision
	loads     map[string]Load
	scrapes   map[string]fleet.Result
	ejects    map[string]time.Time
	answers   []Answer
	// complete: loads holds every endpoint this replica has a load on (the
	// heartbeat's full send), so peers forget the others.
	complete bool
	// collected is when the batch was gathered: every change before it is in.
	collected time.Time
}

// send writes a batch as entries of at most sendBatch bytes.
func (m *Mesh) send(ctx context.Context, enc *encoder, b batch) error {
	decisions, loads, scrapes := b.decisions, b.loads, b.scrapes
	var entries [][]byte
	// A complete set of loads split over entries is complete in none: peers
	// then only add to what they hold, and the next heartbeat tries again.
	complete := b.complete
	start := func() { enc.reset(m.cluster, m.cfg.Replica, m.instance, time.Now().UnixNano(), complete) }
	start()
	flush := func() {
		if enc.count > 0 {
			entries = append(entries, enc.bytes())
		}
		complete = false
		start()
	}
	for _, d := range decisions {
		enc.decision(d)
		if len(enc.buf) >= sendBatch {
			flush()
		}
	}
	addrs := make([]string, 0, len(loads))
	for a := range loads {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, a := range addrs {
		enc.load(a, loads[a])
		if len(enc.buf) >= sendBatch {
			flush()
		}
	}
	for a, r := range scrapes {
		enc.scrape(a, r)
		if len(enc.buf) >= sendBatch {
			flush()
		}
	}
	for a, u := range b.ejects {
		enc.ejection(a, u)
	}
	for _, a := range b.answers {
		enc.answer(a)
		if len(enc.buf) >= sendBatch {
			flush()
		}
	}
	flush()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	pipe := m.rdb.Pipeline()
	for _, e := range entries {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: m.stream, MaxLen: m.cfg.Retain, Approx: true, Values: []any{"m", e}})
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		return fmt.Errorf("adding to stream %s: %w", m.stream, err)
	}
	if len(cmds) > 0 {
		if c, ok := cmds[len(cmds)-1].(*redis.StringCmd); ok {
			m.sentMu.Lock()
			switch {
			case m.ownRead != "" && !after(c.Val(), m.ownRead):
				// The reader got there first.
				m.settle(b.collected)
			default:
				if len(m.sent) >= maxUnsettled {
					m.sent = m.sent[1:]
				}
				m.sent = append(m.sent, sentEntry{id: c.Val(), collected: b.collected})
			}
			m.sentMu.Unlock()
		}
	}
	m.setUp(true)
	m.m.messages.WithLabelValues("sent").Add(float64(len(entries)))
	return nil
}

// readLoop applies the peers' entries in order. It first replays what the
// stream retains, applying only its decisions (the loads in it are old), so a
// starting replica's prefix index holds what the live ones routed.
func (m *Mesh) readLoop(ctx context.Context) {
	last, warmUntil := "0", ""
	backoff := 100 * time.Millisecond
	runID, check := "", true
	for ctx.Err() == nil {
		// After a failure, a Redis that restarted (another run id) has a new
		// stream, whose ids its clock may put before the last one read: read
		// it from the start.
		if check {
			id, err := m.runID(ctx)
			if err != nil {
				m.readFailed(ctx, err, &backoff)
				continue
			}
			if runID != "" && id != runID {
				last, warmUntil = "0", "-"
			}
			runID, check = id, false
		}
		if warmUntil == "" {
			id, err := m.lastID(ctx)
			if err != nil {
				m.readFailed(ctx, err, &backoff)
				continue
			}
			warmUntil = id
		}
		res, err := m.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{m.stream, last}, Count: readBatch, Block: m.cfg.Heartbeat}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			m.readFailed(ctx, err, &backoff)
			check = true
			continue
		}
		backoff = 100 * time.Millisecond
		m.setUp(true)
		for _, s := range res {
			for _, e := range s.Messages {
				last = e.ID
				m.apply(e, warmUntil != "-" && !after(e.ID, warmUntil))
			}
		}
		if warmUntil != "-" && !after(warmUntil, last) {
			warmUntil = "-" // replayed: from here on everything applies
		}
	}
}

func (m *Mesh) readFailed(ctx context.Context, err error, backoff *time.Duration) {
	if ctx.Err() != nil {
		return
	}
	m.setUp(false)
	m.warn("shared state: reading from Redis failed", err)
	select {
	case <-ctx.Done():
	case <-time.After(*backoff):
	}
	*backoff = min(2*(*backoff), 2*time.Second)
}

// runID is the Redis server's run id, new at each start.
func (m *Mesh) runID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	info, err := m.rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("reading Redis's run id: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", nil
}

// lastID is the stream's newest entry ("-" when empty): the end of the replay.
func (m *Mesh) lastID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	msgs, err := m.rdb.XRevRangeN(ctx, m.stream, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("reading stream %s: %w", m.stream, err)
	}
	if len(msgs) == 0 {
		return "-", nil
	}
	return msgs[0].ID, nil
}

// after says whether stream id a comes after b.
func after(a, b string) bool {
	if b == "-" {
		return true
	}
	am, as := splitID(a)
	bm, bs := splitID(b)
	return am > bm || am == bm && as > bs
}

func splitID(id string) (uint64, uint64) {
	for i := range len(id) {
		if id[i] == '-' {
			ms, _ := strconv.ParseUint(id[:i], 10, 64)
			seq, _ := strconv.ParseUint(id[i+1:], 10, 64)
			return ms, seq
		}
	}
	ms, _ := strconv.ParseUint(id, 10, 64)
	return ms, 0
}

// apply applies one entry; replay applies only its decisions.
func (m *Mesh) apply(e redis.XMessage, replay bool) {
	raw, _ := e.Values["m"].(string)
	if len(raw) > m.cfg.MaxMessage {
		m.m.messages.WithLabelValues("oversized").Inc()
		return
	}
	msg, err := decode([]byte(raw), m.cluster)
	switch {
	case errors.Is(err, errForeign):
		m.m.messages.WithLabelValues("foreign").Inc()
		return
	case err != nil:
		m.m.messages.WithLabelValues("malformed").Inc()
		return
	}
	self := msg.replica == m.cfg.Replica
	switch {
	case self && msg.instance == m.instance:
		m.readBack(e.ID) // this replica's own
		return
	case self && !replay:
		// Another process with this replica's name: ranks and scrape
		// assignment go wrong. Its entries are counted as a peer's.
		m.m.messages.WithLabelValues("duplicate_name").Inc()
		m.warn("shared state: another replica is named "+m.cfg.Replica, errDuplicateName)
	}
	m.m.messages.WithLabelValues("received").Inc()
	for _, d := range msg.decisions {
		m.state.PeerDecision(d)
	}
	// Old answers still teach a starting replica what its peers learned of
	// each endpoint's speed (the model forgets them as new ones come).
	for _, a := range msg.answers {
		m.state.PeerAnswer(a)
	}
	// Times the sender stamped by its clock are read by the offset from its
	// sending, on this replica's clock: the nodes' clocks need not agree.
	now := time.Now()
	sent := time.Unix(0, msg.sent)
	local := func(t time.Time) time.Time { return now.Add(t.Sub(sent)) }
	// An ejection still running matters to a replica that just started too
	// (replayed, its offset is from an old sending, and it has ended sooner).
	for addr, until := range msg.ejections {
		if u := local(until); u.After(now) && !replay {
			if limit := now.Add(maxEjection); u.After(limit) {
				u = limit
			}
			m.state.PeerEjection(addr, u)
		}
	}
	if replay {
		return
	}
	for addr, r := range msg.scrapes {
		if r.Started = local(r.Started); r.Started.After(now) {
			r.Started = now // a scrape from the future began at the latest now
		}
		m.state.PeerScrape(addr, r)
	}
	lag := now.Sub(sent)
	m.m.propagation.Observe(max(lag, 0).Seconds())
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	key := msg.replica
	if self {
		key += "#" + strconv.FormatUint(msg.instance, 16)
	}
	p := m.peers[key]
	if p == nil {
		if len(m.peers) >= maxPeers {
			m.m.messages.WithLabelValues("too_many_peers").Inc()
			return
		}
		p = &peer{loads: map[string]Load{}}
		m.peers[key] = p
	}
	p.seen, p.lag = now, lag
	p.messages++
	p.bytes += uint64(len(raw))
	touched := msg.loads
	if msg.complete {
		// Every endpoint the peer has a load on: it has none on the others.
		touched = maps.Clone(msg.loads)
		if touched == nil {
			touched = map[string]Load{}
		}
		for addr := range p.loads {
			if _, ok := msg.loads[addr]; !ok {
				delete(p.loads, addr)
				touched[addr] = Load{}
			}
		}
	}
	for addr, l := range msg.loads {
		p.loads[addr] = l
	}
	m.resum(touched)
}

// resum recomputes, for the endpoints touched (nil: all), the live peers'
// summed load and applies it. peersMu is held.
func (m *Mesh) resum(touched map[string]Load) {
	addrs := map[string]struct{}{}
	if touched == nil {
		for a := range m.sums {
			addrs[a] = struct{}{}
		}
		for _, p := range m.peers {
			for a := range p.loads {
				addrs[a] = struct{}{}
			}
		}
	} else {
		for a := range touched {
			addrs[a] = struct{}{}
		}
	}
	for a := range addrs {
		var sum Load
		for _, p := range m.peers {
			sum = sum.add(p.loads[a])
		}
		if sum == m.sums[a] {
			continue
		}
		if sum == (Load{}) {
			delete(m.sums, a)
		} else {
			m.sums[a] = sum
		}
		m.state.SetPeerLoad(a, sum)
	}
}

// heartbeatScript registers a replica at Redis's clock, drops the members
// silent past the expiry and lists the live ones: one round trip, one clock.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
table.insert(live, tostring(now))
return live
`)

// heartbeatLoop announces this replica and forgets peers that went silent.
func (m *Mesh) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	for {
		m.heartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Mesh) heartbeat(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	res, err := heartbeatScript.Run(cctx, m.rdb, []string{m.members}, m.cfg.Replica, m.cfg.Expiry.Milliseconds()).StringSlice()
	now := time.Now()
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			m.setUp(false)
			m.warn("shared state: heartbeat to Redis failed", err)
		}
	}
	listed := map[string]bool{}
	if err == nil {
		m.setUp(true)
		// A member whose last heartbeat (by Redis's clock) is this old is
		// taken for gone now (3 missed of the default 5): checked once a
		// heartbeat, a dead replica's loads then stop counting a heartbeat
		// before the expiry of its last one, not one or two after it.
		cutoff := max(m.cfg.Expiry-2*m.cfg.Heartbeat, m.cfg.Expiry/2).Milliseconds()
		redisNow, _ := strconv.ParseInt(res[len(res)-1], 10, 64)
		for i := 0; i+1 < len(res)-1; i += 2 {
			id := res[i]
			if id == m.cfg.Replica {
				continue
			}
			if beat, perr := strconv.ParseFloat(res[i+1], 64); perr == nil && redisNow-int64(beat) > cutoff {
				continue
			}
			listed[id] = true
			p := m.peers[id]
			if p == nil {
				p = &peer{loads: map[string]Load{}}
				m.peers[id] = p
			}
			p.seen, p.listed = now, true
		}
	}
	// A peer silent past the expiry (or every peer, with Redis away that
	// long) is gone, and so is one no longer among the members (it closed, or
	// missed its heartbeats), or never among them and silent for a heartbeat:
	// its loads no longer count.
	gone := false
	for id, p := range m.peers {
		if now.Sub(p.seen) > m.cfg.Expiry || err == nil && !listed[id] && (p.listed || now.Sub(p.seen) > m.cfg.Heartbeat) {
			delete(m.peers, id)
			gone = true
		}
	}
	if gone {
		m.resum(nil)
	}
	m.m.peers.Set(float64(len(m.peers)))
	names := []string{m.cfg.Replica}
	for id := range m.peers {
		names = append(names, id)
	}
	sort.Strings(names)
	m.live.Store(&names)
	m.state.SetReplicas(slices.Index(names, m.cfg.Replica), len(names))
}

// Owns says whether this replica is the one to scrape addr: the live replica
// with the highest hash of its name and addr (rendezvous hashing), so that
// a replica leaving moves only its own endpoints. Alone, it owns them all.
func (m *Mesh) Owns(addr string) bool {
	names := m.live.Load()
	if names == nil || len(*names) <= 1 {
		return true
	}
	best, owner := uint64(0), ""
	for _, n := range *names {
		if h := xxhash.Sum64String(n + "\x00" + addr); owner == "" || h > best {
			best, owner = h, n
		}
	}
	return owner == m.cfg.Replica
}

// sentEntry is one of this replica's stream entries awaiting its read-back.
type sentEntry struct {
	id        string
	collected time.Time
}

// maxUnsettled bounds the entries remembered until they are read back.
const maxUnsettled = 4096

// Settled is the time up to which this replica's changes are known to every
// peer's view and every peer's earlier changes to its own: the gathering of
// its last entry read back from the stream, which orders all entries, so
// that every peer entry before it has been applied here, and every peer
// applies it before any of that peer's later ones. Zero until one is read
// back, and while Redis is away.
func (m *Mesh) Settled() time.Time {
	if n := m.settled.Load(); n > 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// readBack notes that the reader reached this replica's own entry id: it and
// every one before it are read back.
func (m *Mesh) readBack(id string) {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	if m.ownRead == "" || after(id, m.ownRead) {
		m.ownRead = id
	}
	for len(m.sent) > 0 && !after(m.sent[0].id, m.ownRead) {
		m.settle(m.sent[0].collected)
		m.sent = m.sent[1:]
	}
}

// settle moves Settled up to t; sentMu is held.
func (m *Mesh) settle(t time.Time) {
	if n := t.UnixNano(); n > m.settled.Load() {
		m.settled.Store(n)
	}
}

// Answered queues what an answer taught of an endpoint's speed, for the peers.
func (m *Mesh) Answered(a Answer) {
	m.mu.Lock()
	if len(m.answers) < maxPending {
		m.answers = append(m.answers, a)
	}
	m.mu.Unlock()
	m.Touch()
}

// Ejected queues an outlier ejection for the peers.
func (m *Mesh) Ejected(addr string, until time.Time) {
	m.mu.Lock()
	if m.ejects == nil {
		m.ejects = map[string]time.Time{}
	}
	m.ejects[addr] = until
	m.mu.Unlock()
	m.Touch()
}

// Scraped queues a scrape's result for the peers.
func (m *Mesh) Scraped(addr string, r fleet.Result) {
	m.mu.Lock()
	if m.scrapes == nil {
		m.scrapes = map[string]fleet.Result{}
	}
	m.scrapes[addr] = r
	m.mu.Unlock()
	m.Touch()
}

// PeerView is a peer as /debug/replicas shows it.
type PeerView struct {
	Replica  string `json:"replica"`
	SeenAgo  string `json:"seenAgo"`
	Lag      string `json:"lag"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	Loads    int    `json:"endpoints"`
}

// View is the mesh as /debug/replicas shows it.
type View struct {
	Replica  string             `json:"replica"`
	Cluster  string             `json:"cluster"`
	Redis    string             `json:"redis"`
	Up       bool               `json:"connected"`
	Pending  int                `json:"pendingDecisions"`
	Dropped  int                `json:"droppedDecisions"`
	Peers    []PeerView         `json:"peers"`
	Counters map[string]float64 `json:"messages"`
}

// View reports the mesh's state.
func (m *Mesh) View() View {
	v := View{Replica: m.cfg.Replica, Cluster: m.cfg.Cluster, Redis: m.cfg.Addr, Up: m.up.Load(), Peers: []PeerView{}, Counters: m.m.counts()}
	m.mu.Lock()
	v.Pending, v.Dropped = len(m.pending), m.dropped
	m.mu.Unlock()
	now := time.Now()
	m.peersMu.Lock()
	for id, p := range m.peers {
		v.Peers = append(v.Peers, PeerView{Replica: id, SeenAgo: now.Sub(p.seen).Round(time.Millisecond).String(), Lag: p.lag.Round(10 * time.Microsecond).String(),
			Messages: p.messages, Bytes: p.bytes, Loads: len(p.loads)})
	}
	m.peersMu.Unlock()
	sort.Slice(v.Peers, func(i, j int) bool { return v.Peers[i].Replica < v.Peers[j].Replica })
	return v
}
