package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

func startSim(t *testing.T, cfg sim.Config) *simserver.Server {
	return simtest.Start(t, simserver.Options{Engine: cfg})
}

// busy sends n long completions to addr at once; the group waits for their
// answers.
func busy(addr string, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			body := `{"model":"m","prompt":"` + strings.Repeat("word ", 400) + `","max_tokens":100,"ignore_eos":true}`
			if resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body)); err == nil {
				resp.Body.Close()
			}
		})
	}
	return &wg
}

func TestScrapesFollowTheServer(t *testing.T) {
	s := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 2, NumGPUBlocks: 4000})
	f := New(Config{Interval: 20 * time.Millisecond})
	defer f.Close()
	f.Sync(context.Background(), []Target{{Addr: s.Addr()}})
	snap := func() Snapshot { return f.Snapshot([]string{s.Addr()})[0] }
	waittest.Until(t, 5*time.Second, "the first scrape", func() bool { return snap().Scraped })
	if got := snap(); !got.Healthy || got.Stale || got.NumBlocks != 4000 || got.BlockSize != 16 || got.Dialect != "vllm" {
		t.Fatalf("first snapshot %+v", got)
	}
	wg := busy(s.Addr(), 5)
	waittest.Until(t, 5*time.Second, "load in the scraped metrics", func() bool { g := snap(); return g.Running == 2 && g.Waiting == 3 && g.KVUsage > 0 })
	wg.Wait()
	waittest.Until(t, 5*time.Second, "the load to drain", func() bool { g := snap(); return g.Running == 0 && g.Waiting == 0 })
}

func TestFailingEndpointTurnsUnhealthyAndStale(t *testing.T) {
	s := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b"})
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	f := New(Config{Interval: 10 * time.Millisecond, Timeout: 200 * time.Millisecond, Now: clock})
	defer f.Close()
	f.Sync(context.Background(), []Target{{Addr: s.Addr()}})
	snap := func() Snapshot { return f.Snapshot([]string{s.Addr()})[0] }
	waittest.Until(t, 5*time.Second, "the first scrape", func() bool { return snap().Healthy })
	if err := s.SetFaults(simserver.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "three failed scrapes", func() bool { return !snap().Healthy })
	if g := snap(); g.Stale || g.LastError == "" {
		t.Fatalf("unhealthy but not yet stale expected: %+v", g)
	}
	advance(3 * time.Second)
	if g := snap(); !g.Stale || g.Age < 3*time.Second {
		t.Fatalf("3 s without a scrape and not stale: %+v", g)
	}
	_ = s.SetFaults(simserver.Faults{})
	waittest.Until(t, 5*time.Second, "recovery", func() bool { g := snap(); return g.Healthy && !g.Stale })
}

// Dispatches between two scrapes count toward the queue and KV until the server's
// own metrics show them; completions of requests the server already counted lower
// the running estimate.
func TestInFlightAccounting(t *testing.T) {
	s := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b", NumGPUBlocks: 1000})
	f := New(Config{Interval: time.Hour}) // one scrape, at start
	defer f.Close()
	f.Sync(context.Background(), []Target{{Addr: s.Addr()}})
	snap := func() Snapshot { return f.Snapshot([]string{s.Addr()})[0] }
	waittest.Until(t, 5*time.Second, "the first scrape", func() bool { return snap().Scraped })
	var tickets []Ticket
	for range 10 {
		tickets = append(tickets, f.Dispatched(s.Addr(), 1600, 1600)) // 100 blocks each
	}
	if g := snap(); g.Waiting != 10 || g.Pending != 10 || g.KVUsage != 1 {
		t.Fatalf("after 10 dispatches of 100 blocks into 1000: %+v", g)
	}
	for _, tk := range tickets[:4] {
		f.Completed(tk)
	}
	if g := snap(); g.Waiting != 6 || g.KVUsage < 0.59 || g.KVUsage > 0.61 {
		t.Fatalf("after 4 completions: waiting %v KV %v", g.Waiting, g.KVUsage)
	}
	f.Completed(Ticket{}) // unknown tickets are ignored
	f.Sync(context.Background(), nil)
	if got := f.Snapshot([]string{s.Addr()}); len(got) != 1 || got[0].Scraped || got[0].Healthy || !got[0].Stale || got[0].Pending != 0 {
		t.Fatalf("removed endpoint kept its state: %+v", got)
	}
}

// A server scraped in the wrong dialect fails its scrapes rather than reading as
// idle.
func TestWrongDialectFails(t *testing.T) {
	s := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b"})
	f := New(Config{Interval: 10 * time.Millisecond})
	defer f.Close()
	f.Sync(context.Background(), []Target{{Addr: s.Addr(), Map: engine.Builtin(engine.SGLang)}}) // the wrong dialect for a vLLM server
	waittest.Until(t, 5*time.Second, "failures", func() bool { g := f.Snapshot([]string{s.Addr()})[0]; return g.Failures >= 3 && !g.Healthy })
	// Corrected by a later Sync, the same scraper recovers.
	f.Sync(context.Background(), []Target{{Addr: s.Addr(), Map: engine.Builtin(engine.VLLM)}})
	waittest.Until(t, 5*time.Second, "recovery", func() bool { g := f.Snapshot([]string{s.Addr()})[0]; return g.Healthy && g.Dialect == "vllm" })
}

// The accounting as the virtual-time benchmark drives it: dispatches count until
// a scrape that began after them, prefill tokens until the first token.
func TestAccounting(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var a Accounting
	snap := func(at time.Duration) Snapshot { return a.Snapshot("e", t0.Add(at), 2*time.Second, 3) }
	if s := snap(0); s.Healthy || !s.Stale {
		t.Fatalf("never scraped: %+v", s)
	}
	a.Observed(engine.Metrics{Waiting: 1, Running: 2, KVUsage: 0.5, NumBlocks: 1000, BlockSize: 16}, engine.VLLM, t0)
	id1 := a.Dispatch(t0.Add(10*time.Millisecond), 1600, 1600, 16) // 100 blocks
	id2 := a.Dispatch(t0.Add(20*time.Millisecond), 320, 320, 16)
	var id3 uint64
	for _, tc := range []struct {
		name    string
		step    func()
		at      time.Duration
		waiting float64
		running float64
		kv      float64
		prefill int
		stale   bool
	}{
		{"two dispatched", func() {}, 30 * time.Millisecond, 3, 2, 0.5 + 120.0/1000, 1920, false},
		{"first token of one: running", func() { a.FirstToken(id1) }, 30 * time.Millisecond, 2, 3, 0.5 + 120.0/1000, 320, false},
		{"a scrape right after both still counts them", func() {
			a.Observed(engine.Metrics{Waiting: 2, Running: 2, KVUsage: 0.5, NumBlocks: 1000}, engine.VLLM, t0.Add(50*time.Millisecond))
		}, 55 * time.Millisecond, 3, 3, 0.5 + 120.0/1000, 320, false},
		{"a scrape a step later trusts the server", func() {
			a.Observed(engine.Metrics{Waiting: 0, Running: 4, KVUsage: 0.6, NumBlocks: 1000}, engine.VLLM, t0.Add(100*time.Millisecond))
		}, 110 * time.Millisecond, 0, 4, 0.6, 320, false},
		{"one completes", func() { a.Complete(id2) }, 110 * time.Millisecond, 0, 3, 0.6, 0, false},
		{"a scrape counts a new one queued", func() {
			id3 = a.Dispatch(t0.Add(120*time.Millisecond), 160, 160, 16)
			a.Observed(engine.Metrics{Waiting: 1, Running: 3, KVUsage: 0.6, NumBlocks: 1000}, engine.VLLM, t0.Add(200*time.Millisecond))
		}, 210 * time.Millisecond, 1, 3, 0.6, 160, false},
		{"its first token takes it out of the queue", func() { a.FirstToken(id3) }, 210 * time.Millisecond, 0, 4, 0.6, 0, false},
		{"its completion out of the batch", func() { a.Complete(id3) }, 210 * time.Millisecond, 0, 3, 0.6, 0, false},
		{"stale after 2 s", func() {}, 3 * time.Second, 0, 3, 0.6, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.step()
			s := snap(tc.at)
			if s.Waiting != tc.waiting || s.Running != tc.running || s.KVUsage != tc.kv || s.PrefillTokens != tc.prefill || s.Stale != tc.stale {
				t.Fatalf("got waiting %v running %v kv %v prefill %d stale %v", s.Waiting, s.Running, s.KVUsage, s.PrefillTokens, s.Stale)
			}
		})
	}
}

// TestExternal: an External fleet scrapes nothing; Observe feeds its metrics,
// with the dispatch accounting folded in as for scraped ones.
func TestExternal(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := New(Config{External: true, Now: func() time.Time { return now }})
	defer f.Close()
	// An address nothing listens on: a scraper would mark it failing.
	f.Sync(context.Background(), []Target{{Addr: "127.0.0.1:1"}})
	f.Observe("127.0.0.1:1", engine.Metrics{Waiting: 2, NumBlocks: 100, BlockSize: 16}, engine.VLLM, now)
	f.Observe("10.0.0.9:1", engine.Metrics{Waiting: 9}, engine.VLLM, now) // not in the fleet: ignored
	now = now.Add(time.Second)
	f.Dispatched("127.0.0.1:1", 160, 160)
	s := f.Snapshot([]string{"127.0.0.1:1", "10.0.0.9:1"})
	if !s[0].Scraped || !s[0].Healthy || s[0].Failures != 0 || s[0].Waiting != 3 || s[0].KVUsage != 0.1 || s[0].Age != time.Second {
		t.Errorf("observed endpoint: %+v", s[0])
	}
	if s[1].Scraped {
		t.Errorf("an address outside the fleet reads as scraped: %+v", s[1])
	}
}

// TestBackoff: failed scrapes back off, but never past half the staleness
// bound: an endpoint back from a restart is read within a second by default (it
// waited 3.2 s, past the 2 s bound).
func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{{1, 50 * time.Millisecond}, {2, 100 * time.Millisecond}, {5, 800 * time.Millisecond}, {6, time.Second}, {20, time.Second}} {
		t.Run(fmt.Sprint(tc.failures), func(t *testing.T) {
			if got := backoff(50*time.Millisecond, 2*time.Second, tc.failures); got != tc.want {
				t.Errorf("after %d failures: %v, want %v", tc.failures, got, tc.want)
			}
		})
	}
	if got := backoff(3*time.Second, 2*time.Second, 9); got != 3*time.Second {
		t.Errorf("an interval above the bound: %v", got)
	}
}

// TestUnreachable: a snapshot reads unreachable only while every scrape since
// the last success got no answer — a process gone or frozen, not one whose
// /metrics answers an error.
func TestUnreachable(t *testing.T) {
	noAnswer := unreachable{errors.New("connection refused")}
	answered := errors.New("metrics answered 500 Internal Server Error")
	for _, tc := range []struct {
		name     string
		failures []error
		want     bool
	}{
		{"scraped fine", nil, false},
		{"refused", []error{noAnswer, noAnswer, noAnswer}, true},
		{"metrics answer 500", []error{answered, answered, answered}, false},
		{"answered, then refused", []error{answered, noAnswer}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Accounting
			now := time.Unix(100, 0)
			a.Observed(engine.Metrics{}, engine.VLLM, now)
			for _, err := range tc.failures {
				a.Failed(err)
			}
			if s := a.Snapshot("a", now, 2*time.Second, 3); s.Unreachable != tc.want {
				t.Errorf("unreachable %v, want %v", s.Unreachable, tc.want)
			}
		})
	}
	if !IsUnreachable(fmt.Errorf("scrape: %w", noAnswer)) || IsUnreachable(answered) {
		t.Error("IsUnreachable")
	}
}

// TestPeerLoad: another replica's load (its dispatches since the scrape, its
// prompts awaiting a first token) adds to this one's view of the endpoint, and
// Loads reports this replica's own.
func TestPeerLoad(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := New(Config{External: true, Now: func() time.Time { return now }})
	defer f.Close()
	f.Sync(context.Background(), []Target{{Addr: "a"}})
	f.Observe("a", engine.Metrics{Waiting: 2, Running: 1, NumBlocks: 100, BlockSize: 16}, engine.VLLM, now)
	f.Dispatched("a", 160, 160)
	own := map[string]Load{}
	f.Loads(func(addr string, l Load) { own[addr] = l })
	if want := (Load{Queued: 1, Blocks: 10, PrefillTokens: 160, PrefillWork: 160}); own["a"] != want {
		t.Fatalf("own load %+v, want %+v", own["a"], want)
	}
	f.SetPeerLoad("a", Load{Queued: 2, Started: 1, Blocks: 30, StartedBefore: 1, PrefillTokens: 320, PrefillWork: 100})
	f.SetPeerLoad("gone", Load{Queued: 9}) // not in the fleet: ignored
	s := f.Snapshot([]string{"a"})[0]
	// waiting: 2 scraped - 1 started since + 1 own + 2 peers'; running 1 + 1 moved + 1 started.
	if s.Waiting != 4 || s.Running != 3 || s.KVUsage != 0.4 || s.PrefillTokens != 480 || s.PrefillWork != 260 || s.Pending != 4 {
		t.Fatalf("with a peer's load: %+v", s)
	}
}

// TestSharedScraping: an endpoint another replica scrapes is not scraped here
// while its results keep coming; its results (a failure included) stand for
// this replica's own; once they stop, this replica scrapes it itself within
// two scrape waits and the slack. The endpoint a replica owns is scraped and
// each result published.
func TestSharedScraping(t *testing.T) {
	s := startSim(t, sim.Config{GPU: "h100", ModelSize: "8b"})
	f := New(Config{Interval: 20 * time.Millisecond})
	defer f.Close()
	var mu sync.Mutex
	published := 0
	f.SetSharing(&Sharing{Owns: func(string) bool { return false }, Publish: func(string, Result) { mu.Lock(); published++; mu.Unlock() }})
	f.Sync(context.Background(), []Target{{Addr: s.Addr()}})
	snap := func() Snapshot { return f.Snapshot([]string{s.Addr()})[0] }
	stop := make(chan struct{})
	var feed sync.WaitGroup
	feed.Go(func() { // the peer that owns it
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			f.ObserveResult(s.Addr(), Result{Started: time.Now(), Metrics: engine.Metrics{Waiting: float64(i%5 + 1), NumBlocks: 777}, Dialect: engine.VLLM})
		}
	})
	waittest.Until(t, 5*time.Second, "the peer's scrapes", func() bool { return snap().NumBlocks == 777 })
	time.Sleep(300 * time.Millisecond)
	if n := s.Scrapes(); n > 1 { // the first tick may come before any result
		t.Fatalf("scraped %d times while a peer published", n)
	}
	close(stop)
	feed.Wait()
	silent := time.Now()
	waittest.Until(t, 5*time.Second, "the takeover", func() bool { return snap().NumBlocks != 777 && snap().Scraped })
	if d := time.Since(silent); d > 2*20*time.Millisecond+TakeoverSlack+500*time.Millisecond {
		t.Errorf("took over after %v", d)
	}
	mu.Lock()
	if published == 0 {
		t.Error("its own scrapes were not published")
	}
	mu.Unlock()
	// A failure a peer saw counts as this replica's own would.
	ext := New(Config{External: true})
	defer ext.Close()
	ext.Sync(context.Background(), []Target{{Addr: "e"}})
	ext.ObserveResult("e", Result{Started: time.Now(), Metrics: engine.Metrics{NumBlocks: 1}})
	ext.ObserveResult("e", Result{Started: time.Now(), Err: "connection refused", Unreachable: true})
	if g := ext.Snapshot([]string{"e"})[0]; g.Failures != 1 || !g.Unreachable || g.LastError != "connection refused" || !g.Scraped {
		t.Fatalf("a peer's failed scrape: %+v", g)
	}
}
