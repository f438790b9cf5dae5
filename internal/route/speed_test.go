package route

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/latency"
)

// The tests below route streamed requests to model servers of unequal speed,
// played on the virtual clock, and assert that predictedLatency (in the
// default profile) learns each one's speed from the first bytes and ends the
// core sees, and sends each its share by speed.

// fakeServer is a model server on the virtual clock: it prefills one prompt
// at a time, in arrival order, in base plus perKToken a thousand prompt
// tokens, then streams a token every step, alongside the others. Each request
// holds its tokens' KV blocks, of blocks in all, until it ends.
type fakeServer struct {
	base, perKToken, step time.Duration
	blocks                int
	free                  time.Time // when the prompts it holds are prefilled
	waiting, running      int
}

// kvBlock is the tokens of a KV block.
const kvBlock = 16

// prefill is how long a prompt of tokens takes to prefill.
func (s *fakeServer) prefill(tokens int) time.Duration {
	return s.base + s.perKToken*time.Duration(tokens)/1000
}

// slow makes the server's engine run at 1/f of its speed.
func (s *fakeServer) slow(f time.Duration) {
	s.base, s.perKToken, s.step = f*s.base, f*s.perKToken, f*s.step
}

// virtualPool plays requests through a router against fake servers: each
// request is routed at the clock's time, its first byte and end are events
// at the times its server gives them, and every scrapeEvery the servers'
// queues, batches and KV caches are observed as a scrape would read them.
type virtualPool struct {
	t        *testing.T
	g        *Router
	clk      *clock
	servers  map[string]*fakeServer
	events   []event
	seq      int
	inFlight int
	served   map[string]int // requests ended, by endpoint
}

// scrapeEvery is the pool's scrape interval, the fleet's default.
const scrapeEvery = 50 * time.Millisecond

type event struct {
	at  time.Time
	seq int // events due at once run in the order they were scheduled
	run func()
}

// promptTokens and outputTokens are the size of every request: a prompt of
// about 2,000 tokens, unique (no prefix is shared), and a short answer.
const promptTokens, outputTokens = 2000, 8

// newVirtualPool routes to servers with one scheduler, which edit may change.
func newVirtualPool(t *testing.T, servers map[string]*fakeServer, edit func(*v1alpha1.SchedulerSpec)) *virtualPool {
	clk := newClock()
	addrs := slices.Sorted(maps.Keys(servers))
	sc := schedulerSpec("p", llama, addrs...)
	if edit != nil {
		edit(&sc)
	}
	p := &virtualPool{t: t, clk: clk, servers: servers, served: map[string]int{},
		g: newRouter(t, clk, testConfig(sc))}
	p.scrape()
	return p
}

// at schedules run at t.
func (p *virtualPool) at(t time.Time, run func()) {
	p.seq++
	p.events = append(p.events, event{at: t, seq: p.seq, run: run})
}

// scrape observes every server now and schedules the next scrape.
func (p *virtualPool) scrape() {
	for a, s := range p.servers {
		held := (s.waiting + s.running) * (promptTokens + outputTokens + kvBlock - 1) / kvBlock
		observe(p.g, p.clk, engine.Metrics{Waiting: float64(s.waiting), Running: float64(s.running),
			KVUsage: float64(held) / float64(s.blocks), BlockSize: kvBlock, NumBlocks: s.blocks}, a)
	}
	p.at(p.clk.Now().Add(scrapeEvery), p.scrape)
}

// send routes one streamed request now and schedules its first byte and its
// end; done, when set, runs at its end. It returns the endpoint picked.
func (p *virtualPool) send(done func()) string {
	now := p.clk.Now()
	r := pick(p.t, p.g, Request{Model: llama, BodyBytes: 4 * promptTokens})
	addr := r.Served()
	r.Sent(addr)
	s := p.servers[addr]
	first := now
	if s.free.After(first) {
		first = s.free
	}
	first = first.Add(s.prefill(promptTokens))
	s.free = first
	s.waiting++
	p.inFlight++
	p.at(first, func() {
		s.waiting--
		s.running++
		r.FirstByte(200, true)
	})
	p.at(first.Add((outputTokens-1)*s.step), func() {
		s.running--
		p.inFlight--
		p.served[addr]++
		r.Finish(Outcome{Status: 200, UsageSeen: true, PromptTokens: promptTokens, CompletionTokens: outputTokens})
		if done != nil {
			done()
		}
	})
	return addr
}

// step runs the next event, moving the clock to it.
func (p *virtualPool) step() {
	i := 0
	for j, e := range p.events {
		if e.at.Before(p.events[i].at) || e.at.Equal(p.events[i].at) && e.seq < p.events[i].seq {
			i = j
		}
	}
	e := p.events[i]
	p.events = slices.Delete(p.events, i, i+1)
	p.clk.Set(e.at)
	e.run()
}

// runFor runs the events due within d from now, and moves the clock to its end.
func (p *virtualPool) runFor(d time.Duration) {
	end := p.clk.Now().Add(d)
	for slices.ContainsFunc(p.events, func(e event) bool { return !e.at.After(end) }) {
		p.step()
	}
	p.clk.Set(end)
}

// drain runs events until no request is in flight.
func (p *virtualPool) drain() {
	for p.inFlight > 0 {
		p.step()
	}
}

// speeds are the endpoints' learned speeds, by address.
func (p *virtualPool) speeds() map[string]latency.Speed {
	out := map[string]latency.Speed{}
	for _, e := range p.g.FleetView()[0].Endpoints {
		out[e.Address] = e.Speed
	}
	return out
}

// gpus are three servers of an 8B model on different GPUs: their prefill
// throughput (about an H100's, an A100's and an A10G's at half their peak
// FLOPS) and KV cache (80, 80 and 24 GB less the weights).
func gpus() map[string]*fakeServer {
	return map[string]*fakeServer{
		h100: {base: 10 * time.Millisecond, perKToken: 32 * time.Millisecond, step: 7 * time.Millisecond, blocks: 26_000},
		a100: {base: 10 * time.Millisecond, perKToken: 100 * time.Millisecond, step: 12 * time.Millisecond, blocks: 26_000},
		a10g: {base: 20 * time.Millisecond, perKToken: 256 * time.Millisecond, step: 30 * time.Millisecond, blocks: 2_600},
	}
}

const h100, a100, a10g = "h100:8000", "a100:8000", "a10g:8000"

// TestBurstSplitsBySpeed: three servers of different GPUs, every one idle at
// the last scrape, take a burst of 60 requests arriving at once with the
// default profile, once each has learned its speed: the split follows their
// speeds, the A10G getting no more than its share of the fleet's capacity
// and two where an even split would give it 20, and the faster a server the
// more it gets. Without predictedLatency the KV cache
// scorer alone holds the A10G back less.
func TestBurstSplitsBySpeed(t *testing.T) {
	total := 0.0
	for _, s := range gpus() {
		total += 1 / s.prefill(promptTokens).Seconds()
	}
	share := 1 / gpus()[a10g].prefill(promptTokens).Seconds() / total
	most := int(share*60) + 2
	withSpeed := speedBurst(t, nil)
	t.Logf("the A10G's capacity share %.0f%%; the burst's 60 went %v", 100*share, withSpeed)
	if withSpeed[a10g] > most {
		t.Errorf("the A10G took %d of 60, at most %d wanted (its capacity share %.0f%%, an even split 20)", withSpeed[a10g], most, 100*share)
	}
	// The H100 and the A100 have like KV caches: only their speeds tell
	// them apart.
	if withSpeed[h100] < withSpeed[a100]+3 || withSpeed[a100] < withSpeed[a10g] {
		t.Errorf("the burst went %v: want the H100 at least 3 more than the A100, and the A100 no fewer than the A10G", withSpeed)
	}
	zero := int32(0)
	without := speedBurst(t, func(sc *v1alpha1.SchedulerSpec) { sc.Weights = &v1alpha1.Weights{PredictedLatency: &zero} })
	t.Logf("without predictedLatency the burst went %v", without)
	if withSpeed[a10g]+2 > without[a10g] {
		t.Errorf("the A10G took %d of the burst knowing the speeds, %d without: want at least 2 fewer", withSpeed[a10g], without[a10g])
	}
}

// speedBurst warms the gpus pool up until every server has learned its
// speed, then sends a burst of 60 requests at once and counts where they went.
func speedBurst(t *testing.T, edit func(*v1alpha1.SchedulerSpec)) map[string]int {
	p := newVirtualPool(t, gpus(), edit)
	// Waves of ten requests per server, at least three and until every one
	// has learned a speed of its own: each sees work queued (a pod only ever
	// idle tells its latency, not its throughput).
	for wave := 0; ; wave++ {
		if wave == 20 {
			t.Fatalf("after %d waves some endpoint still borrows its speed: %+v", wave, p.speeds())
		}
		for range 10 * len(p.servers) {
			p.send(nil)
		}
		p.drain()
		if wave >= 2 && !slices.ContainsFunc([]string{h100, a100, a10g}, func(a string) bool { return p.speeds()[a].Borrowed }) {
			break
		}
	}
	p.runFor(time.Second) // a scrape or more: every server reads idle
	burst := map[string]int{}
	for range 60 {
		burst[p.send(nil)]++
	}
	p.drain()
	return burst
}

// TestSlowdownLosesShare: of two like servers under steady load, the one whose
// engine slows to half speed mid-run loses share within the stated time
// (docs/configuration.md: a few dozen of its answers; here 10 s), and its
// learned speed shows it.
func TestSlowdownLosesShare(t *testing.T) {
	const slowed, other = "h100-a:8000", "h100-b:8000"
	servers := map[string]*fakeServer{
		slowed: {base: 10 * time.Millisecond, perKToken: 32 * time.Millisecond, step: 7 * time.Millisecond, blocks: 26_000},
		other:  {base: 10 * time.Millisecond, perKToken: 32 * time.Millisecond, step: 7 * time.Millisecond, blocks: 26_000},
	}
	p := newVirtualPool(t, servers, nil)
	// Six closed-loop clients: each sends its next request when its last ends.
	var client func()
	client = func() { p.send(client) }
	for range 6 {
		client()
	}
	window := func(d time.Duration) float64 {
		a0, b0 := p.served[slowed], p.served[other]
		p.runFor(d)
		a, b := p.served[slowed]-a0, p.served[other]-b0
		return float64(a) / float64(a+b)
	}
	before := window(4 * time.Second)
	servers[slowed].slow(2)
	p.runFor(10 * time.Second) // the stated time
	after := window(5 * time.Second)
	sp := p.speeds()
	predict := func(a string) float64 { return sp[a].TTFT(promptTokens, 0, 0, 0) }
	step := func(a string) float64 { return sp[a].StepBase + sp[a].StepPerRunning*3 }
	t.Logf("share before %.2f, after %.2f; learned TTFT %.3f s and step %.4f s slowed, %.3f s and %.4f s other",
		before, after, predict(slowed), step(slowed), predict(other), step(other))
	if before < 0.4 || before > 0.6 || after > 0.4 || after > before-0.1 {
		t.Errorf("the slowed server's share went from %.2f to %.2f (want about half, then under 0.4)", before, after)
	}
	// Its first bytes and its streams' ends both tell it (the step model
	// forgets more slowly: a stream teaches it once, at its end).
	if predict(slowed) < 1.5*predict(other) {
		t.Errorf("learned TTFT of a 2,000-token prompt: %.3f s slowed, %.3f s other; want the slowed's at least 1.5× the other's", predict(slowed), predict(other))
	}
	if step(slowed) < 1.3*step(other) {
		t.Errorf("learned step: %.4f s slowed, %.4f s other; want the slowed's at least 1.3× the other's", step(slowed), step(other))
	}
	p.events = nil // the clients stop; their requests' Finish runs no more
}
