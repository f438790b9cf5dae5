package route

import (
	"github.com/kvgate/kvgate/internal/proxy"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/latency"
)

// The tests below check what teaches an endpoint's speed: only what the
// endpoint did, timed from when it had the whole request (Sent) to its first
// token, in an answer it accepted.

// TestOnlyTheEndpointsDoingTeaches: each case routes MinSamples+1 requests of
// 2,000 prompt tokens to one endpoint, whose prefill takes 0.2 s, and ends
// them as the case says; the endpoint's learned speed then predicts about
// 0.2 s (it learned from the answers) or it learned nothing.
func TestOnlyTheEndpointsDoingTeaches(t *testing.T) {
	const addr = "10.0.0.1:8000"
	const prefill = 200 * time.Millisecond
	upload := 40 * time.Second // a 40 KB body at 1 KB/s
	for _, c := range []struct {
		name  string
		learn bool
		play  func(clk *clock, r *Route)
	}{
		{"a body that took 40 s to upload, timed from its last byte", true, func(clk *clock, r *Route) {
			clk.Advance(upload)
			r.Sent(addr)
			clk.Advance(prefill)
			r.FirstByte(http.StatusOK, true)
			r.Finish(Outcome{Status: http.StatusOK})
		}},
		{"an error status as a stream", false, func(clk *clock, r *Route) {
			r.Sent(addr)
			clk.Advance(upload)
			r.FirstByte(http.StatusServiceUnavailable, true)
			r.Finish(Outcome{Status: http.StatusServiceUnavailable})
		}},
		{"a client error as a stream", false, func(clk *clock, r *Route) {
			r.Sent(addr)
			clk.Advance(upload)
			r.FirstByte(http.StatusTooManyRequests, true)
			r.Finish(Outcome{Status: http.StatusTooManyRequests})
		}},
		{"a connection failure", false, func(clk *clock, r *Route) {
			clk.Advance(upload)
			r.Failed(addr)
			r.Finish(Outcome{Status: http.StatusServiceUnavailable, Unanswered: true, EndpointsFailed: true})
		}},
		{"a first-byte timeout", false, func(clk *clock, r *Route) {
			r.Sent(addr)
			clk.Advance(time.Minute)
			r.Failed(addr)
			r.Finish(Outcome{Status: http.StatusGatewayTimeout, Unanswered: true})
		}},
		{"an answer before the body was all written", false, func(clk *clock, r *Route) {
			clk.Advance(upload)
			r.FirstByte(http.StatusOK, true)
			r.Sent(addr) // too late: the endpoint answered without it
			r.Finish(Outcome{Status: http.StatusOK})
		}},
		{"a Sent for another endpoint", false, func(clk *clock, r *Route) {
			r.Sent("10.0.0.9:8000")
			clk.Advance(prefill)
			r.FirstByte(http.StatusOK, true)
			r.Finish(Outcome{Status: http.StatusOK})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, addr)))
			observe(g, clk, engine.Metrics{BlockSize: kvBlock, NumBlocks: 26_000}, addr)
			for range latency.MinSamples + 1 {
				c.play(clk, pick(t, g, Request{Model: llama, BodyBytes: 4 * promptTokens, BodyPending: true}))
				clk.Advance(time.Second)
				observe(g, clk, engine.Metrics{BlockSize: kvBlock, NumBlocks: 26_000}, addr)
			}
			s := g.FleetView()[0].Endpoints[0].Speed
			got := s.TTFT(promptTokens, 0, 0, 0)
			switch {
			case !c.learn && s.Samples != 0:
				t.Errorf("learned from %d answers (predicts %.2f s); want none", s.Samples, got)
			case c.learn && (s.Samples != latency.MinSamples+1 || got < 0.1 || got > 0.4):
				t.Errorf("learned from %d answers, predicts %.2f s; want %d answers and about %v", s.Samples, got, latency.MinSamples+1, prefill)
			}
		})
	}
}

// TestPendingBodyIsNoWorkAhead: a request picked while its body still
// arrives is no prefill work at its endpoint until the body is all sent;
// then it is, until its first token.
func TestPendingBodyIsNoWorkAhead(t *testing.T) {
	const addr = "10.0.0.1:8000"
	clk := newClock()
	g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, addr)))
	observe(g, clk, engine.Metrics{BlockSize: kvBlock, NumBlocks: 26_000}, addr)
	work := func() int { return g.FleetView()[0].Endpoints[0].PrefillTokens }
	r := pick(t, g, Request{Model: llama, BodyBytes: 4 * promptTokens, BodyPending: true})
	if w := work(); w != 0 {
		t.Errorf("while the body arrives the endpoint has %d prompt tokens ahead; want 0", w)
	}
	clk.Advance(40 * time.Second)
	r.Sent(addr)
	if w := work(); w != promptTokens {
		t.Errorf("once sent the endpoint has %d prompt tokens ahead; want %d", w, promptTokens)
	}
	r.FirstByte(http.StatusOK, true)
	if w := work(); w != 0 {
		t.Errorf("after its first token the endpoint has %d prompt tokens ahead; want 0", w)
	}
	r.Finish(Outcome{Status: http.StatusOK})
	// A body held whole at the pick counts at once, as before.
	r = pick(t, g, Request{Model: llama, BodyBytes: 4 * promptTokens})
	if w := work(); w != promptTokens {
		t.Errorf("a whole body's request puts %d prompt tokens ahead; want %d", w, promptTokens)
	}
	r.Finish(Outcome{Status: http.StatusOK})
}

// TestPendingBodyRecordsItsPromptWhenSent: the prefix index believes an
// endpoint holds a prompt only once its body was all sent there; an upload
// given up midway leaves nothing in the engine's cache, nor in the index.
func TestPendingBodyRecordsItsPromptWhenSent(t *testing.T) {
	const addr = "10.0.0.1:8000"
	prompt := []byte(strings.Repeat(`{"role":"system","content":"a long system prompt"},`, 64))
	for _, tc := range []struct {
		name   string
		sent   bool
		status int
		held   bool
	}{
		{"sent, then answered", true, http.StatusOK, true},
		{"given up before it was all sent", false, proxy.StatusClientClosed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, addr)))
			observe(g, clk, engine.Metrics{BlockSize: kvBlock, NumBlocks: 26_000}, addr)
			blocks := func() int { return g.FleetView()[0].Endpoints[0].PrefixBlocks }
			r := pick(t, g, Request{Model: llama, Prompt: prompt, BodyBytes: int64(len(prompt)), BodyPending: true})
			if b := blocks(); b != 0 {
				t.Fatalf("while the body arrives the index holds %d of its blocks there; want 0", b)
			}
			if tc.sent {
				r.Sent(addr)
				r.FirstByte(tc.status, true)
			}
			r.Finish(Outcome{Status: tc.status})
			if b := blocks(); (b > 0) != tc.held {
				t.Errorf("the index holds %d of its blocks there; want some: %v", b, tc.held)
			}
		})
	}
}
