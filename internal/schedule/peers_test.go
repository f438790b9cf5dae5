package schedule

import (
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/engine"
)

// peer is an endpoint as the peers' rules read it: its prefix match, its
// uncached prompt tokens awaiting a first token, and its KV blocks.
func peer(addr string, match, work, kvUsage float64) Endpoint {
	e := ep(addr, engine.Metrics{KVUsage: kvUsage, BlockSize: 16, NumBlocks: 1000})
	e.PrefixMatch, e.PrefillWork = match, work
	return e
}

func queued(e Endpoint, waiting float64) Endpoint {
	e.Waiting = waiting
	return e
}

// pickWith runs the named profile's picker, with several seeds: a rule
// without ties picks the same endpoint whatever the seed.
func pickWith(t *testing.T, profile v1alpha1.ProfileName, req Request, eps []Endpoint) string {
	t.Helper()
	pr, err := LookupProfile(string(profile))
	if err != nil {
		t.Fatal(err)
	}
	first := ""
	for seed := range uint64(8) {
		d := NewWeighted(pr, Thresholds{}, seed).Pick(req, append([]Endpoint(nil), eps...))
		if len(d.Ranked) == 0 {
			t.Fatal("no decision")
		}
		if got := d.Ranked[0].Address; first == "" {
			first = got
		} else if got != first {
			t.Fatalf("seed %d picks %s, seed 0 %s: the rule has a tie", seed, got, first)
		}
	}
	return first
}

// TestLLMDSticky: a request stays on its cache-warm endpoint until that
// endpoint's queued uncached prefill outlasts the least loaded other's by
// 18 s at 15,928 tokens/s (286,704 tokens); then, as when nothing is warm,
// the fewest uncached tokens in flight (this request's included) win.
func TestLLMDSticky(t *testing.T) {
	req := Request{PromptTokens: 4000}
	gate := LLMDMaxTTFTPenalty.Seconds() * LLMDPeakPrefillThroughput
	if gate != 286704 {
		t.Fatalf("gate %v tokens, llm-d's defaults make 286,704", gate)
	}
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		want string
	}{
		{"warm and loaded below the gate keeps the request",
			[]Endpoint{peer("warm", 0.9, 200000, 0), peer("idle", 0, 0, 0), peer("cold", 0.5, 1000, 0)}, "warm"},
		{"warm at the gate exactly keeps it",
			[]Endpoint{peer("warm", 0.9, 1000+gate, 0), peer("idle", 0, 5000, 0), peer("cold", 0, 1000, 0)}, "warm"},
		{"warm past the gate loses it to the least token load",
			[]Endpoint{peer("warm", 0.9, 1000+gate+16, 0), peer("idle", 0, 5000, 0), peer("cold", 0, 1000, 0)}, "cold"},
		{"the gate measures against the least loaded cold endpoint",
			[]Endpoint{peer("warm", 0.95, 300000, 0), peer("busy", 0, 100000, 0)}, "warm"},
		{"below the affinity threshold is cold",
			[]Endpoint{peer("almost", 0.79, 5000, 0), peer("idle", 0, 0, 0)}, "idle"},
		{"cold: fewest uncached tokens, this request's included",
			// 5000 + 4000 against 1000 + 0.5 × 4000.
			[]Endpoint{peer("a", 0, 5000, 0), peer("b", 0.5, 1000, 0)}, "b"},
		{"among warm endpoints, the least token load",
			[]Endpoint{peer("w1", 1, 9000, 0), peer("w2", 0.85, 2000, 0), peer("idle", 0, 0, 0)}, "w2"},
		{"no saturation filter: llm-d's default reads no scraped load",
			[]Endpoint{peer("warm", 1, 0, 0.97), peer("idle", 0, 0, 0)}, "warm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickWith(t, v1alpha1.ProfileLLMDSticky, req, tc.eps); got != tc.want {
				t.Errorf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// TestKVCostBlocks: Dynamo's cost on small cases worked by hand, 64-token
// prompts in 16-token blocks (4 blocks), 1000 blocks per endpoint.
func TestKVCostBlocks(t *testing.T) {
	req := Request{PromptTokens: 64}
	for _, tc := range []struct {
		name string
		e    Endpoint
		want float64
	}{
		// 4 prefill blocks + 0 active + 4 new.
		{"idle and cold", peer("b", 0, 0, 0), 8},
		// 4 − 3 cached to prefill + 5 active + 1 new.
		{"3 of 4 blocks cached, 5 blocks active", peer("a", 0.75, 0, 0.005), 7},
		// (32 + 64) / 16 = 6 to prefill + 4 new.
		{"cold with 32 uncached tokens in flight", peer("c", 0, 32, 0), 10},
		// 0 to prefill + 10 active + 0 new.
		{"all cached, 10 blocks active", peer("d", 1, 0, 0.01), 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KVCostBlocks(req, &tc.e); got != tc.want {
				t.Errorf("cost %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("blocks not published: 16-token blocks, no active blocks", func(t *testing.T) {
		e := Endpoint{Address: "x", Signals: Signals{Metrics: engine.Metrics{Missing: engine.SignalBlocks, KVUsage: 0.5}}}
		if got := KVCostBlocks(Request{PromptTokens: 64}, &e); got != 8 {
			t.Errorf("cost %v, want 8", got)
		}
	})
}

// TestDynamoKV: the lowest cost wins whatever the seed (temperature 0), and
// the cache credit is worth its blocks: 3 cached blocks beat an idle cold
// endpoint until the warm one holds 6 more active blocks.
func TestDynamoKV(t *testing.T) {
	req := Request{PromptTokens: 64}
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		want string
	}{
		{"3 of 4 cached beats idle cold (7 < 8)", []Endpoint{peer("idle", 0, 0, 0), peer("warm", 0.75, 0, 0.005)}, "warm"},
		{"until its active blocks outweigh the credit (9 > 8)", []Endpoint{peer("idle", 0, 0, 0), peer("warm", 0.75, 0, 0.007)}, "idle"},
		{"prefill in flight counts", []Endpoint{peer("queued", 0.75, 160, 0), peer("idle", 0, 0, 0)}, "idle"},
		{"no saturation filter: a queue of 10 is no cost", []Endpoint{queued(peer("cached", 1, 0, 0.002), 10), peer("idle", 0, 0, 0)}, "cached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickWith(t, v1alpha1.ProfileDynamoKV, req, tc.eps); got != tc.want {
				t.Errorf("picked %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("ties at random", func(t *testing.T) {
		pr, err := LookupProfile(string(v1alpha1.ProfileDynamoKV))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for seed := range uint64(32) {
			d := NewWeighted(pr, Thresholds{}, seed).Pick(req, []Endpoint{peer("a", 0, 0, 0), peer("b", 0, 0, 0), peer("c", 0, 0, 0.5)})
			seen[d.Ranked[0].Address] = true
		}
		if !seen["a"] || !seen["b"] || seen["c"] {
			t.Errorf("first picks %v, want a and b, never c", seen)
		}
	})
}
