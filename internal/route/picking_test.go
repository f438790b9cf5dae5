package route

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/logtest"
)

// The tests below feed endpoints' metrics as scrapes would read them, on a
// virtual clock, and assert where the core sends requests.

const (
	ep1 = "10.0.0.1:8000"
	ep2 = "10.0.0.2:8000"
	ep3 = "10.0.0.3:8000"
	ep4 = "10.0.0.4:8000"
)

// TestLoadedEndpointGetsLessTraffic: an endpoint with a deep queue or a
// nearly full KV cache is passed over for an idle one.
func TestLoadedEndpointGetsLessTraffic(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy engine.Metrics
	}{
		{"deep queue", engine.Metrics{Waiting: 3, Running: 1}},
		{"full KV cache", engine.Metrics{Running: 2, KVUsage: 0.7, BlockSize: 16, NumBlocks: 300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, ep1, ep2)))
			observe(g, clk, tc.busy, ep1)
			observe(g, clk, engine.Metrics{BlockSize: 16, NumBlocks: 300}, ep2)
			got := served(t, g, 12, model)
			if got[ep1] > 1 || got[ep2] < 11 {
				t.Fatalf("busy served %d of 12, idle %d", got[ep1], got[ep2])
			}
		})
	}
}

// TestAdapterGoesToItsHolder: a request for a LoRA adapter goes to the pod
// running it rather than to an equally loaded pod that would have to load it,
// and never to a pod with no slot for it.
func TestAdapterGoesToItsHolder(t *testing.T) {
	const holder, other, full = ep1, ep2, ep3
	for _, tc := range []struct {
		adapter, holder string
	}{
		{"sql-lora", holder},
		{"chat-lora", full}, // the one slot of full holds it
	} {
		t.Run(tc.adapter, func(t *testing.T) {
			clk := newClock()
			sc := schedulerSpec("p", llama, holder, other, full)
			sc.LoRAAdapters = []string{"sql-lora", "chat-lora"}
			g := newRouter(t, clk, testConfig(sc))
			// The same load everywhere: one request each; holder runs
			// sql-lora, full chat-lora in its only slot, other the base model.
			lora := func(running ...string) engine.Metrics {
				return engine.Metrics{Running: 1, HasLoRA: true, MaxLoRA: 1, RunningAdapters: running}
			}
			observe(g, clk, lora("sql-lora"), holder)
			observe(g, clk, lora(), other)
			observe(g, clk, lora("chat-lora"), full)
			got := served(t, g, 10, func(int) Request { return Request{Model: tc.adapter} })
			if got[tc.holder] < 9 {
				t.Errorf("%s requests: %v, want at least 9 at %s", tc.adapter, got, tc.holder)
			}
			if tc.holder != full && got[full] != 0 {
				t.Errorf("%s requests: %v, none wanted at %s, whose only slot is taken", tc.adapter, got, full)
			}
		})
	}
}

// TestPrefixAffinity: requests sharing a long system prompt stick to one
// endpoint until its load makes another better, and then stick to that one.
func TestPrefixAffinity(t *testing.T) {
	clk := newClock()
	addrs := []string{ep1, ep2, ep3}
	g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, addrs...)))
	observe(g, clk, engine.Metrics{}, addrs...)
	system := strings.Repeat("You are the support assistant of Example Corp. Follow the policy below. ", 60)
	ask := func(i int) Request {
		return Request{Model: llama, Prompt: fmt.Appendf(nil, `[{"role":"system","content":%q},{"role":"user","content":"question %d"}]`, system, i)}
	}
	first := served(t, g, 10, ask)
	if len(first) != 1 {
		t.Fatalf("shared-prefix requests spread: %v", first)
	}
	holder := slices.Collect(maps.Keys(first))[0]
	if got := metric(t, g, "kvgate_prefix_match_ratio"); got != 10 {
		t.Errorf("prefix match observations %v, want 10", got)
	}
	if metric(t, g, "kvgate_prefix_index_blocks") == 0 {
		t.Error("prefix index reports no blocks")
	}
	// A deep queue on the holder (saturated at 5 waiting) makes another
	// endpoint better; the group moves there and sticks again.
	observe(g, clk, engine.Metrics{Waiting: 7, Running: 2}, holder)
	then := served(t, g, 10, func(i int) Request { return ask(100 + i) })
	if then[holder] > 0 || len(then) != 1 {
		t.Fatalf("after loading the holder: %v (holder %s)", then, holder)
	}
}

// TestBurstSpreads: a burst arriving between two scrapes spreads over the
// pool instead of herding onto the endpoint that looked idlest at the last
// one: the core counts its own dispatches on top of the scrape. (Random tie
// breaks alone would spread the idle pool too, but not this evenly.)
func TestBurstSpreads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metrics map[string]engine.Metrics
		n       int
		want    map[string][2]int // the fewest and most each endpoint takes
	}{
		{"four idle", map[string]engine.Metrics{ep1: {}, ep2: {}, ep3: {}, ep4: {}}, 200,
			map[string][2]int{ep1: {48, 52}, ep2: {48, 52}, ep3: {48, 52}, ep4: {48, 52}}},
		// Without the accounting every request would go to the pod with the
		// emptier batch and KV cache at the last scrape.
		{"one idle, one running two", map[string]engine.Metrics{ep1: {}, ep2: {Running: 2, KVUsage: 0.05, BlockSize: 16, NumBlocks: 10000}}, 20,
			map[string][2]int{ep1: {10, 17}, ep2: {3, 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			addrs := slices.Sorted(maps.Keys(tc.metrics))
			g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, addrs...)))
			for a, m := range tc.metrics {
				observe(g, clk, m, a)
			}
			if h, s := metric(t, g, "kvgate_endpoint_healthy"), metric(t, g, "kvgate_endpoint_stale"); h != float64(len(addrs)) || s != 0 {
				t.Errorf("fleet metrics: healthy %v stale %v, want %d and 0", h, s, len(addrs))
			}
			got := held(t, g, tc.n, func(int) Request { return Request{Model: llama, BodyBytes: 2000} })
			for a, w := range tc.want {
				if got[a] < w[0] || got[a] > w[1] {
					t.Fatalf("burst of %d: %v, want %d to %d at %s", tc.n, got, w[0], w[1], a)
				}
			}
		})
	}
}

// TestStaleEndpoints: an endpoint whose metrics stopped coming is avoided
// while others are fresh; when all are stale the picker fails open and keeps
// serving over all of them.
func TestStaleEndpoints(t *testing.T) {
	clk := newClock()
	cfg := testConfig(schedulerSpec("p", llama, ep1, ep2))
	cfg.Spec.Gateway.Scrape = &v1alpha1.ScrapeSpec{StaleAfter: &metav1.Duration{Duration: 300 * time.Millisecond}}
	g := newRouter(t, clk, cfg)
	observe(g, clk, engine.Metrics{}, ep1, ep2)
	clk.Advance(200 * time.Millisecond)
	observe(g, clk, engine.Metrics{}, ep2) // ep1's scrapes stop coming
	clk.Advance(200 * time.Millisecond)
	if s := g.Snapshot([]string{ep1, ep2}); !s[0].Stale || !s[0].Healthy || s[1].Stale {
		t.Fatalf("want ep1 stale (and healthy), ep2 fresh: %+v", s)
	}
	got := held(t, g, 20, model) // however many ep2 already has in flight
	if got[ep1] != 0 || got[ep2] != 20 {
		t.Fatalf("with ep1 stale: %v", got)
	}
	// Failing open, the core still counts what it sent: ep1, with none of
	// the 20 in flight, takes most of the next ones.
	clk.Advance(time.Second)
	got = held(t, g, 40, model)
	if got[ep1]+got[ep2] != 40 || got[ep1] < 25 || got[ep2] < 5 {
		t.Fatalf("all stale must fail open over both: %v", got)
	}
}

// TestDecisionLogSampled: at debug level one decision in DecisionLogEvery is logged
// with every candidate's scores.
func TestDecisionLogSampled(t *testing.T) {
	var logs logtest.Buffer
	clk := newClock()
	g := newRouter(t, clk, testConfig(schedulerSpec("p", llama, ep1, ep2)), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.DecisionLogEvery = 3
	})
	observe(g, clk, engine.Metrics{}, ep1, ep2)
	served(t, g, 6, model)
	if n := strings.Count(logs.String(), "msg=decision"); n != 2 {
		t.Fatalf("%d decisions logged of 6 at 1 in 3:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "kvCache=") {
		t.Errorf("decision log lacks the scores: %s", logs.String())
	}
}
