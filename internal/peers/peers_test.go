package peers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// state is a replica's routing state as the tests hold it: its own loads,
// and what its peers sent.
type state struct {
	mu        sync.Mutex
	own       map[string]Load
	peerLoads map[string]Load
	decisions []Decision
	rank      int
	replicas  int
	scrapes   map[string]fleet.Result
	ejections map[string]time.Time
	answers   []Answer
}

func newState() *state { return &state{own: map[string]Load{}, peerLoads: map[string]Load{}} }

func (s *state) EachLoad(fn func(string, Load)) {
	s.mu.Lock()
	own := make(map[string]Load, len(s.own))
	for a, l := range s.own {
		own[a] = l
	}
	s.mu.Unlock()
	for a, l := range own {
		fn(a, l)
	}
}

func (s *state) SetPeerLoad(addr string, l Load) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peerLoads[addr] = l
}

func (s *state) PeerDecision(d Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decisions = append(s.decisions, d)
}

func (s *state) SetReplicas(rank, replicas int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rank, s.replicas = rank, replicas
}

func (s *state) PeerScrape(addr string, r fleet.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.scrapes == nil {
		s.scrapes = map[string]fleet.Result{}
	}
	s.scrapes[addr] = r
}

func (s *state) scrape(addr string) (fleet.Result, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.scrapes[addr]
	return r, ok
}

func (s *state) PeerEjection(addr string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ejections == nil {
		s.ejections = map[string]time.Time{}
	}
	s.ejections[addr] = until
}

func (s *state) ejection(addr string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ejections[addr]
}

func (s *state) PeerAnswer(a Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers = append(s.answers, a)
}

func (s *state) place() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rank, s.replicas
}

func (s *state) setOwn(addr string, l Load) {
	s.mu.Lock()
	s.own[addr] = l
	s.mu.Unlock()
}

func (s *state) peerLoad(addr string) Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerLoads[addr]
}

func (s *state) decided() []Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.decisions)
}

// start runs a mesh of cluster "c" on r until the test ends.
func start(t *testing.T, r *redistest.Server, name string, st State) *Mesh {
	t.Helper()
	m := New(Config{Addr: r.Addr(), Cluster: "c", Replica: name, Heartbeat: 100 * time.Millisecond, Timeout: 200 * time.Millisecond,
		Registerer: prometheus.NewRegistry()}, st)
	m.Start(context.Background())
	t.Cleanup(m.Close)
	return m
}

// pair runs replicas "a" and "b" on a Redis of their own until the test ends.
func pair(t *testing.T) (a *Mesh, sa, sb *state) {
	t.Helper()
	r := redistest.Start(t)
	sa, sb = newState(), newState()
	a = start(t, r, "a", sa)
	start(t, r, "b", sb)
	return a, sa, sb
}

func hasDecision(ds []Decision, endpoint string, first uint64) bool {
	return slices.ContainsFunc(ds, func(d Decision) bool {
		return d.Endpoint == endpoint && len(d.Hashes) > 0 && d.Hashes[0] == first
	})
}

// TestShare: a decision and a load of one replica reach the other; the loads
// of several peers are summed; a replica that leaves takes its load along;
// a replica that starts replays the retained decisions, not the old loads.
func TestShare(t *testing.T) {
	r := redistest.Start(t)
	sa, sb, sc := newState(), newState(), newState()
	a := start(t, r, "a", sa)
	start(t, r, "b", sb)
	a.Decided(Decision{Endpoint: "10.0.0.1:8000", Capacity: 500, Hashes: []uint64{7, 8, 9}})
	sa.setOwn("10.0.0.1:8000", Load{Load: fleet.Load{Queued: 3, Blocks: 30, PrefillTokens: 600, PrefillWork: 500}, InFlight: 4})
	a.Touch()
	waittest.Until(t, 5*time.Second, "b to get a's decision and load", func() bool {
		return hasDecision(sb.decided(), "10.0.0.1:8000", 7) && sb.peerLoad("10.0.0.1:8000").InFlight == 4
	})
	if d := sb.decided()[0]; d.Capacity != 500 || !slices.Equal(d.Hashes, []uint64{7, 8, 9}) {
		t.Fatalf("decision %+v", d)
	}
	until := time.Now().Add(time.Minute)
	a.Ejected("10.0.0.2:8000", until)
	a.Ejected("10.0.0.3:8000", time.Now().Add(-time.Second)) // already over: not applied
	// Read on b's clock by its offset from the sending: within the propagation.
	near := func(got time.Time) bool { d := got.Sub(until); return d > -time.Second && d < time.Second }
	waittest.Until(t, 5*time.Second, "b to get a's ejection", func() bool { return near(sb.ejection("10.0.0.2:8000")) })
	c := start(t, r, "c", sc)
	sc.setOwn("10.0.0.1:8000", Load{InFlight: 2})
	c.Touch()
	waittest.Until(t, 5*time.Second, "b to sum a's and c's loads, c to replay a's decision and get a's load (sent in full every heartbeat)", func() bool {
		l := sc.peerLoad("10.0.0.1:8000")
		return sb.peerLoad("10.0.0.1:8000").InFlight == 6 && hasDecision(sc.decided(), "10.0.0.1:8000", 7) && l.InFlight == 4 && l.Queued == 3
	})
	waittest.Until(t, 5*time.Second, "b to rank second of three", func() bool { r, n := sb.place(); return r == 1 && n == 3 })
	if !sb.ejection("10.0.0.3:8000").IsZero() {
		t.Errorf("b holds an ejection that had ended: %v", sb.ejection("10.0.0.3:8000"))
	}
	a.Close()
	waittest.Until(t, 5*time.Second, "a's load to leave b's view, b first of two", func() bool {
		r, n := sb.place()
		return sb.peerLoad("10.0.0.1:8000").InFlight == 2 && r == 0 && n == 2
	})
}

// TestMessageSafety: entries that are garbage, too large or of another
// cluster are counted and dropped; the replica goes on applying good ones.
func TestMessageSafety(t *testing.T) {
	r := redistest.Start(t)
	sb := newState()
	b := start(t, r, "b", sb)
	rc := r.Client(t)
	ctx := context.Background()
	var enc encoder
	enc.reset(identity("other"), "x", 1, time.Now().UnixNano(), false)
	enc.decision(Decision{Endpoint: "e", Hashes: []uint64{1}})
	foreign := enc.bytes()
	enc.reset(identity("c"), "x", 1, time.Now().UnixNano(), false)
	enc.decision(Decision{Endpoint: "e", Hashes: []uint64{2}})
	good := enc.bytes()
	for _, v := range []any{"garbage", string(good[:len(good)-3]), string(foreign), string(make([]byte, 2<<20)), string(good)} {
		if err := rc.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []any{"m", v}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waittest.Until(t, 5*time.Second, "the good entry to apply", func() bool { return hasDecision(sb.decided(), "e", 2) })
	if hasDecision(sb.decided(), "e", 1) {
		t.Fatal("another cluster's decision applied")
	}
	waittest.Until(t, 2*time.Second, "the bad entries counted", func() bool {
		c := b.View().Counters
		return c["malformed"] == 2 && c["foreign"] == 1 && c["oversized"] == 1 && c["received"] == 1
	})
}

// TestRedisAway: with Redis killed, deciding never blocks and the mesh says
// it is down; once Redis is back (empty), what was decided meanwhile and the
// loads reach the peer.
func TestRedisAway(t *testing.T) {
	r := redistest.Start(t)
	sa, sb := newState(), newState()
	a := start(t, r, "a", sa)
	b := start(t, r, "b", sb)
	waittest.Until(t, 5*time.Second, "both up", func() bool { return a.View().Up && b.View().Up })
	r.Kill()
	began := time.Now()
	for i := range 1000 {
		a.Decided(Decision{Endpoint: "e", Hashes: []uint64{uint64(i + 1)}})
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("1,000 decisions with Redis away took %v", d)
	}
	waittest.Until(t, 5*time.Second, "a to see Redis down", func() bool { return !a.View().Up })
	sa.setOwn("e", Load{InFlight: 3})
	a.Touch()
	r.Restart(t)
	waittest.Until(t, 10*time.Second, "the decisions and load made while Redis was away to arrive", func() bool {
		return hasDecision(sb.decided(), "e", 1000) && sb.peerLoad("e").InFlight == 3
	})
}

// TestDecodeBounds: every truncation of a valid message fails cleanly.
func TestDecodeBounds(t *testing.T) {
	var enc encoder
	enc.reset(identity("c"), "r", 7, 42, true)
	enc.decision(Decision{Endpoint: "e:1", Capacity: 9, Hashes: []uint64{1, 2, 3}})
	enc.load("e:1", Load{Load: fleet.Load{Queued: 1, Started: 2, Blocks: 3, StartedBefore: 4, Completed: 5, PrefillTokens: 6, PrefillWork: 7}, InFlight: 8})
	enc.scrape("e:1", fleet.Result{Started: time.Unix(5, 0), Metrics: engine.Metrics{Running: 3}, Dialect: engine.SGLang})
	enc.ejection("e:1", time.Unix(9, 0))
	enc.answer(Answer{Endpoint: "e:1", Own: 2000, Ahead: 500, Running: 3, Seconds: 0.25})
	b := enc.bytes()
	m, err := decode(b, identity("c"))
	if err != nil || m.replica != "r" || m.sent != 42 || m.instance != 7 || !m.complete || len(m.decisions) != 1 || m.loads["e:1"].InFlight != 8 || m.loads["e:1"].PrefillWork != 7 || m.scrapes["e:1"].Metrics.Running != 3 || m.scrapes["e:1"].Dialect != engine.SGLang || !m.ejections["e:1"].Equal(time.Unix(9, 0)) || len(m.answers) != 1 || m.answers[0].Seconds != 0.25 || m.answers[0].Own != 2000 {
		t.Fatalf("round trip: %+v %v", m, err)
	}
	for n := range len(b) {
		if _, err := decode(b[:n], identity("c")); err == nil {
			t.Fatalf("a message cut at %d of %d bytes decoded", n, len(b))
		}
	}
	if _, err := decode(b, identity("d")); !errors.Is(err, errForeign) {
		t.Fatalf("another cluster: %v", err)
	}
}

// FuzzDecode: no input makes decode panic.
func FuzzDecode(f *testing.F) {
	var enc encoder
	enc.reset(identity("c"), "r", 1, 1, false)
	enc.decision(Decision{Endpoint: "e", Hashes: []uint64{1}})
	enc.load("e", Load{InFlight: 1})
	f.Add(enc.bytes())
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = decode(b, identity("c")) })
}

// TestScrapeAssignment: among three live replicas each endpoint has exactly
// one scraper; when one leaves, only its endpoints move. A scrape's result,
// failure and unreachability included, reaches the peers.
func TestScrapeAssignment(t *testing.T) {
	r := redistest.Start(t)
	ms := []*Mesh{}
	sts := []*state{}
	for _, n := range []string{"a", "b", "c"} {
		st := newState()
		sts = append(sts, st)
		ms = append(ms, start(t, r, n, st))
	}
	waittest.Until(t, 5*time.Second, "three live replicas", func() bool {
		for _, st := range sts {
			if _, n := st.place(); n != 3 {
				return false
			}
		}
		return true
	})
	owner := func(addr string, among []*Mesh) int {
		found := -1
		for i, m := range among {
			if m.Owns(addr) {
				if found >= 0 {
					t.Fatalf("%s owned by two replicas", addr)
				}
				found = i
			}
		}
		if found < 0 {
			t.Fatalf("%s owned by none", addr)
		}
		return found
	}
	before := map[string]int{}
	count := [3]int{}
	for i := range 60 {
		a := fmt.Sprintf("10.0.0.%d:8000", i)
		before[a] = owner(a, ms)
		count[before[a]]++
	}
	if count[0] == 0 || count[1] == 0 || count[2] == 0 {
		t.Fatalf("assignment %v: a replica scrapes nothing", count)
	}
	began := time.Now().Add(-30 * time.Millisecond)
	ms[0].Scraped("10.0.0.1:8000", fleet.Result{Started: began, Metrics: engine.Metrics{Waiting: 7, NumBlocks: 900}, Dialect: engine.VLLM})
	ms[0].Scraped("10.0.0.2:8000", fleet.Result{Started: time.Unix(2, 0), Err: "dial refused", Unreachable: true})
	waittest.Until(t, 5*time.Second, "b to get a's scrapes", func() bool {
		ok, bad := sts[1].scrape("10.0.0.1:8000")
		_, ok2 := sts[1].scrape("10.0.0.2:8000")
		return bad && ok2 && ok.Metrics.Waiting == 7
	})
	// The start is read on b's clock by its offset from the sending.
	if r, _ := sts[1].scrape("10.0.0.1:8000"); r.Err != "" || r.Dialect != engine.VLLM || r.Metrics.NumBlocks != 900 || r.Started.Before(began) || r.Started.After(time.Now()) {
		t.Fatalf("scrape %+v", r)
	}
	if r, _ := sts[1].scrape("10.0.0.2:8000"); r.Err != "dial refused" || !r.Unreachable {
		t.Fatalf("failed scrape %+v", r)
	}
	ms[2].Close()
	waittest.Until(t, 5*time.Second, "two live replicas", func() bool { _, n := sts[0].place(); _, m := sts[1].place(); return n == 2 && m == 2 })
	for a, was := range before {
		now := owner(a, ms[:2])
		if was != 2 && now != was {
			t.Errorf("%s moved from replica %d to %d when replica 2 left", a, was, now)
		}
	}
}

// TestCompleteLoadsReplace: a peer's load on an endpoint it no longer has one
// on is forgotten with its next complete set (every heartbeat).
func TestCompleteLoadsReplace(t *testing.T) {
	a, sa, sb := pair(t)
	sa.setOwn("e1", Load{InFlight: 1})
	sa.setOwn("e2", Load{InFlight: 2})
	a.Touch()
	waittest.Until(t, 5*time.Second, "b to see both", func() bool { return sb.peerLoad("e1").InFlight == 1 && sb.peerLoad("e2").InFlight == 2 })
	sa.mu.Lock()
	delete(sa.own, "e2")
	sa.mu.Unlock()
	waittest.Until(t, 5*time.Second, "b to forget e2", func() bool { return sb.peerLoad("e2") == (Load{}) && sb.peerLoad("e1").InFlight == 1 })
}

// TestDuplicateName: two processes given one replica name are told apart,
// counted and each other's loads still count.
func TestDuplicateName(t *testing.T) {
	r := redistest.Start(t)
	s1, s2 := newState(), newState()
	m1 := start(t, r, "same", s1)
	m2 := start(t, r, "same", s2)
	s1.setOwn("e", Load{InFlight: 3})
	s2.setOwn("e", Load{InFlight: 1})
	m1.Touch()
	m2.Touch()
	waittest.Until(t, 5*time.Second, "the other to count the duplicate and the load", func() bool {
		return s2.peerLoad("e").InFlight == 3
	})
	waittest.Until(t, 5*time.Second, "the duplicate counted", func() bool { return m1.View().Counters["duplicate_name"] > 0 })
}

// TestPendingBounded: decisions waiting for Redis are bounded by their count
// and by their hashes' size, the oldest dropped first.
func TestPendingBounded(t *testing.T) {
	m := New(Config{Addr: "127.0.0.1:1", Cluster: "c", Registerer: prometheus.NewRegistry()}, newState())
	defer m.Close()
	big := make([]uint64, maxHashes)
	for range 200 {
		m.Decided(Decision{Endpoint: "e", Hashes: big})
	}
	v := m.View()
	if v.Pending*maxHashes > maxPendingHashes || v.Pending == 0 || v.Dropped != 200-v.Pending {
		t.Fatalf("%d pending, %d dropped: over %d hashes", v.Pending, v.Dropped, maxPendingHashes)
	}
	for range maxPending + 10 {
		m.Decided(Decision{Endpoint: "e", Hashes: []uint64{1}})
	}
	if v := m.View(); v.Pending != maxPending {
		t.Fatalf("%d pending, want %d", v.Pending, maxPending)
	}
}

// TestDeadReplicaForgotten: a replica that dies without leaving (killed: no
// last call to Redis) holds its share of the in-flight limits only until the
// expiry of its last heartbeat, with half a heartbeat to spare (the checks run
// once a heartbeat, at any phase to the dead replica's).
func TestDeadReplicaForgotten(t *testing.T) {
	a, sa, sb := pair(t)
	sa.setOwn("10.0.0.1:8000", Load{InFlight: 4})
	a.Touch()
	waittest.Until(t, 5*time.Second, "b to count a's load", func() bool { return sb.peerLoad("10.0.0.1:8000").InFlight == 4 })
	// Killed: its goroutines stop, nothing leaves its name in Redis.
	a.cancel()
	a.done.Wait()
	killed := time.Now()
	// Its last heartbeat, by Redis's clock.
	ctx := context.Background()
	beat, err := a.rdb.ZScore(ctx, a.members, "a").Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := a.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	before := time.Duration(now.UnixMilli()-int64(beat)) * time.Millisecond
	waittest.Until(t, 5*time.Second, "b to forget a's load", func() bool { return sb.peerLoad("10.0.0.1:8000").InFlight == 0 })
	took := before + time.Since(killed)
	expiry := a.cfg.Expiry
	t.Logf("a killed replica's load forgotten %v after its last heartbeat (expiry %v, heartbeat %v)", took.Round(time.Millisecond), expiry, a.cfg.Heartbeat)
	if bound := expiry - a.cfg.Heartbeat/2; took > bound {
		t.Errorf("a killed replica's load counted %v after its last heartbeat, past %v (the %v expiry less half a heartbeat)", took, bound, expiry)
	}
}
