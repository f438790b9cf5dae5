package global

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

type outcome struct {
	start, end time.Time
	member     string
	chunks     int
	err        error
}

// load runs clients sending streaming requests through the router until stop
// is closed, and returns every request's outcome.
func load(base string, clients int, stop <-chan struct{}) func() []outcome {
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	c := sdk(base)
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := outcome{start: time.Now()}
				s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
					Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a story")},
					MaxTokens: openai.Int(20)}, memberOf(&o.member))
				for s.Next() {
					o.chunks++
				}
				o.err, o.end = s.Err(), time.Now()
				_ = s.Close()
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		})
	}
	return func() []outcome { wg.Wait(); return out }
}

// TestFailoverAndRamp: with the cheap member killed mid-run, no request that had
// not started streaming is lost and traffic moves to the other member within
// 5 s; when the member returns, its share grows gradually instead of jumping.
func TestFailoverAndRamp(t *testing.T) {
	a := startTier1(t, 1, simserver.Options{})
	b := startTier1(t, 1, simserver.Options{})
	// The kill is noticed by the refused connections, which eject the member
	// at once; the heartbeat timeout is the default's 2 s rather than
	// fastRouting's 600 ms, which a loaded machine's delayed heartbeats
	// (each may wait 300 ms) overran, taking the surviving member out too.
	routing := fastRouting()
	routing.HeartbeatTimeout = d(2 * time.Second)
	r, base := startRouter(t, routerConfig(routing, a.member("cheap", 1), b.member("dear", 3)), Options{})

	stop := make(chan struct{})
	wait := load(base, 6, stop)
	time.Sleep(1500 * time.Millisecond)
	killed := time.Now()
	a.kill()
	var drained time.Duration
	waittest.Until(t, 10*time.Second, "the killed member drained", func() bool {
		drained = time.Since(killed)
		return r.metric(t, "kvgate_global_member_healthy", "member", "cheap") == 0
	})
	time.Sleep(2 * time.Second)
	restarted := time.Now()
	a.restart()
	// The ramp runs from when the router sees the member back, which a
	// loaded machine delays past the restart.
	var back time.Time
	waittest.Until(t, 10*time.Second, "the restarted member back", func() bool {
		back = time.Now()
		return r.metric(t, "kvgate_global_member_healthy", "member", "cheap") == 1
	})
	time.Sleep(5 * time.Second)
	close(stop)
	outs := wait()

	if drained > 5*time.Second {
		t.Errorf("the dead member was drained after %v, want ≤ 5 s", drained)
	}
	t.Logf("drained %v after the kill", drained)
	var before, beforeDear, during, lost, cutMidStream int
	// Shares of the returning member, by second since the router saw it back.
	var perSecond [5][2]int
	for _, o := range outs {
		switch {
		case o.err != nil && o.chunks == 0:
			lost++
			t.Errorf("request started %v after the kill failed before streaming: %v", o.start.Sub(killed), o.err)
		case o.err != nil:
			cutMidStream++
		case o.end.Before(killed):
			before++
			if o.member != "cheap" {
				beforeDear++
			}
		case o.start.Before(killed):
			// In flight at the kill: it may have failed over; it must not be lost.
		case o.start.Before(restarted):
			during++
			if o.member != "dear" {
				t.Errorf("a request started %v after the kill went to %q", o.start.Sub(killed), o.member)
			}
		case o.start.Before(back):
			// Restarted, not yet seen back.
		default:
			if s := int(o.start.Sub(back) / time.Second); s < len(perSecond) {
				perSecond[s][1]++
				if o.member == "cheap" {
					perSecond[s][0]++
				}
			}
		}
	}
	t.Logf("requests: %d before the kill, %d while it was down, %d cut mid-stream, %d lost; back %v after its restart; cheap's share by second after its return: %v",
		before, during, cutMidStream, lost, back.Sub(restarted).Round(time.Millisecond), perSecond)
	if before == 0 || during == 0 {
		t.Fatalf("too little traffic: %d before, %d during", before, during)
	}
	// The cheap member is inside its SLO: it takes the traffic, but for the
	// odd heartbeat a loaded test machine delays past the 600 ms timeout.
	if beforeDear*10 > before {
		t.Errorf("before the kill %d of %d requests went to the dear member", beforeDear, before)
	}
	share := func(s [2]int) float64 { return float64(s[0]) / float64(max(1, s[1])) }
	if first, last := share(perSecond[0]), share(perSecond[4]); first > 0.6 || last < 0.9 || first >= last {
		t.Errorf("the returning member's share went %.2f in its first second to %.2f in its fifth: want a gradual ramp to all", first, last)
	}
	if n := r.metric(t, "kvgate_global_failovers_total", "from", "cheap", "to", "dear"); n < 1 {
		t.Errorf("no failover counted")
	}
}

// TestHeartbeatDrain: a member that dies while no request goes to it is drained
// by its missing heartbeats alone, well within 5 s, and /readyz follows the
// members.
func TestHeartbeatDrain(t *testing.T) {
	a := startTier1(t, 1, simserver.Options{})
	r, _ := startRouter(t, routerConfig(fastRouting(), a.member("only", 1)), Options{})
	ready := func() int {
		rec := httptest.NewRecorder()
		r.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code
	}
	if code := ready(); code != 200 {
		t.Fatalf("/readyz %d with a healthy member", code)
	}
	killed := time.Now()
	a.kill()
	waittest.Until(t, 10*time.Second, "the member drained", func() bool { return r.metric(t, "kvgate_global_member_healthy", "member", "only") == 0 })
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("drained after %v", took)
	} else {
		t.Logf("drained by heartbeat after %v (timeout 600 ms)", took)
	}
	if code := ready(); code != 503 {
		t.Errorf("/readyz %d without a healthy member", code)
	}
}
