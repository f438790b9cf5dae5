package route

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/peers"
)

// The tests below play closed-loop clients on the virtual clock against three
// like servers, one of which a peer replica's answers taught a speed 50×
// too slow (a stall it saw), and count the probes of it.

const probedA, probedB, probedC = "like-a:8000", "like-b:8000", "like-c:8000"

// likeServers are three servers of one GPU (an H100's prefill of an 8B model).
func likeServers() map[string]*fakeServer {
	out := map[string]*fakeServer{}
	for _, a := range []string{probedA, probedB, probedC} {
		out[a] = &fakeServer{base: 10 * time.Millisecond, perKToken: 32 * time.Millisecond, step: 7 * time.Millisecond, blocks: 26_000}
	}
	return out
}

// probePool starts a virtual pool of likeServers whose learned speeds are
// their true ones, but probedC's slowed times: twenty answers a peer saw of
// each (no answer of this replica yet, so that the pool's median is the
// others'). It returns the pool and its closed-loop clients' start.
func probePool(t *testing.T, slowed float64) (*virtualPool, func(n int)) {
	p := newVirtualPool(t, likeServers(), nil)
	for range 20 {
		for a, s := range p.servers {
			secs := s.prefill(promptTokens).Seconds()
			if a == probedC {
				secs *= slowed
			}
			p.g.PeerAnswer(peers.Answer{Endpoint: a, Own: promptTokens, Seconds: secs})
		}
	}
	clients := func(n int) {
		var client func()
		client = func() { p.send(client) }
		for range n {
			client()
		}
	}
	t.Cleanup(func() { p.events = nil })
	return p, clients
}

// share is probedC's share of the requests ended over the next d.
func (p *virtualPool) share(d time.Duration) float64 {
	before := map[string]int{}
	for a, n := range p.served {
		before[a] = n
	}
	p.runFor(d)
	all, c := 0, p.served[probedC]-before[probedC]
	for a, n := range p.served {
		all += n - before[a]
	}
	return float64(c) / float64(max(all, 1))
}

func (p *virtualPool) probes() float64 {
	return metric(p.t, p.g, "kvgate_probes_total", "scheduler", "p")
}

// TestMisjudgedPodIsProbed: a pod believed 50× slower than it is gets no
// request until it has been idle twice probeAfter (every request is long by
// its belief, none cheap); then one probe, whose answer shows the belief
// wrong, and the pod is back to about its third of the requests, with a
// learned speed within 2× of its true one.
func TestMisjudgedPodIsProbed(t *testing.T) {
	p, clients := probePool(t, 50)
	clients(6)
	if s := p.share(2*probeAfter - time.Second); s != 0 || p.probes() != 0 {
		t.Fatalf("before twice probeAfter the misjudged pod took %.2f of the requests, %v probes; want none", s, p.probes())
	}
	p.runFor(5 * time.Second)
	if n := p.probes(); n != 1 {
		t.Fatalf("%v probes by twice probeAfter and 4 s; want 1", n)
	}
	p.runFor(5 * time.Second)
	s := p.share(10 * time.Second)
	truth := p.servers[probedC].prefill(promptTokens).Seconds()
	got := p.speeds()[probedC].TTFT(promptTokens, 0, 0, 0)
	t.Logf("after the probe: share %.2f, learned TTFT %.3f s (true %.3f s), %v probes", s, got, truth, p.probes())
	if s < 0.25 || s > 0.42 {
		t.Errorf("the probed pod's share is %.2f; want about a third", s)
	}
	if got > 2*truth || got < truth/2 {
		t.Errorf("the probed pod's learned TTFT is %.3f s; want within 2× of %.3f s", got, truth)
	}
	if n := p.probes(); n != 1 {
		t.Errorf("%v probes; want 1 (the pod has traffic again)", n)
	}
}

// TestProbeBounds: a pod rightly believed slow is probed at most once per
// probeAfter, less often as its probes confirm its speed, and each probe
// teaches the belief again (its share stays its probes); pods with traffic,
// and pods of a pool that answers nothing, are never probed.
func TestProbeBounds(t *testing.T) {
	t.Run("a pod rightly believed slow", func(t *testing.T) {
		p, _ := probePool(t, 50)
		p.servers[probedC].slow(50)
		var at []time.Time
		var client func()
		client = func() {
			if p.send(client) == probedC {
				at = append(at, p.clk.Now())
			}
		}
		for range 6 {
			client()
		}
		const rounds = 10
		p.runFor(rounds * probeAfter)
		t.Logf("sent to the slow pod at %v", at)
		if n := p.probes(); n < 2 || n > rounds || int(n) != len(at) {
			t.Errorf("%v probes, %d requests to the slow pod in %v; want 2 to %d probes, and no other request there", n, len(at), rounds*probeAfter, rounds)
		}
		for i := 1; i < len(at); i++ {
			if d := at[i].Sub(at[i-1]); d < probeAfter || i > 1 && d <= at[i-1].Sub(at[i-2]) {
				t.Errorf("probes %v apart, after %v; want at least %v, and longer each time", d, at[i-1].Sub(at[max(i-2, 0)]), probeAfter)
			}
		}
		if got, truth := p.speeds()[probedC].TTFT(promptTokens, 0, 0, 0), p.servers[probedC].prefill(promptTokens).Seconds(); got < truth/2 {
			t.Errorf("the slow pod's learned TTFT is %.3f s; want about its true %.3f s", got, truth)
		}
	})
	t.Run("pods with traffic", func(t *testing.T) {
		p, clients := probePool(t, 1)
		clients(6)
		s := p.share(3 * probeAfter)
		if n := p.probes(); n != 0 || s < 0.25 {
			t.Errorf("%v probes, share %.2f of the third pod; want none, and about a third", n, s)
		}
	})
	t.Run("a pool that answers nothing", func(t *testing.T) {
		p, _ := probePool(t, 50)
		p.runFor(3 * probeAfter)
		p.send(nil)
		p.drain()
		if n := p.probes(); n != 0 || p.served[probedC] != 0 {
			t.Errorf("%v probes, %d requests to the misjudged pod; want none: an idle pool's pods miss nothing", n, p.served[probedC])
		}
	})
}
