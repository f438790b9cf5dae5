package bench

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestSamePicksAsServe: the virtual-time run routes through the routing core
// `kvgate serve` builds. The run's calls into the core — scrapes, picks, first
// tokens, finishes — replayed in the same order and at the same virtual times
// into a gateway made by gateway.New (serve's constructor, its fleet fed by
// Observe instead of HTTP scrapes) pick the same endpoint for every request.
// The trace loads the fleet enough for queues, KV usage, the dispatch
// accounting, prefix affinity and adapters to decide picks.
func TestSamePicksAsServe(t *testing.T) {
	fl := servers("h100", "h100", "8b", 1, 4, nil)
	fl.LoRAModules = []string{"sql", "chat"}
	var tr workload.Trace
	for i := range 600 {
		q := workload.Request{At: float64(i) * 0.004, Model: llama8b, OutputTokens: 40 + i%80,
			Prompt: []workload.Segment{{ID: fmt.Sprint("system-", i%3), Tokens: 1500}, {ID: fmt.Sprint("user-", i), Tokens: 100 + i%300}}}
		if i%5 == 0 {
			q.Adapter = []string{"sql", "chat"}[i%2]
		}
		tr = append(tr, q)
	}
	for _, policy := range []string{"kvgate", "chat", "least-request"} {
		t.Run(policy, func(t *testing.T) {
			opts := SimOptions{Fleet: simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{fl}}, Policy: policy, Seed: 7}
			var events []simEvent
			opts.record = func(e simEvent) { events = append(events, e) }
			if _, _, err := RunSim(context.Background(), opts, tr); err != nil {
				t.Fatal(err)
			}
			cfg, err := simConfig(opts, tr, addrsOf(events))
			if err != nil {
				t.Fatal(err)
			}
			var now time.Duration
			g := gateway.New(gateway.Options{Logger: slog.New(slog.DiscardHandler), Seed: opts.Seed,
				Fleet: fleet.Config{Interval: 50 * time.Millisecond, StaleAfter: 2 * time.Second, UnhealthyAfter: unhealthyAfter, BlockSize: blockTokens,
					Now: func() time.Time { return epoch.Add(now) }, External: true}})
			defer g.Close()
			if err := g.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			routes := map[int]*route.Route{}
			picks, differ := 0, 0
			for _, e := range events {
				now = e.at
				switch e.kind {
				case "scrape":
					g.Observe(e.addr, e.metrics, engine.VLLM, epoch.Add(e.at))
				case "route":
					rt, ref := g.Route(context.Background(), route.Request{Model: e.model, Prompt: e.prompt, BodyBytes: e.bodyBytes, Start: epoch.Add(e.at)})
					if ref != nil {
						t.Fatalf("request %d refused: %v", e.tag, ref)
					}
					picks++
					if rt.Endpoints[0] != e.addr {
						differ++
						if differ <= 3 {
							t.Errorf("request %d at %v: the bench picked %s, serve's core %s", e.tag, e.at, e.addr, rt.Endpoints[0])
						}
					}
					routes[e.tag] = rt
				case "first":
					routes[e.tag].FirstByte(true)
				case "finish":
					routes[e.tag].Finish(e.outcome)
				}
			}
			if picks != len(tr) || differ > 0 {
				t.Fatalf("%d of %d picks differ (%d requests)", differ, picks, len(tr))
			}
			// The picks must have depended on state: one server taking
			// everything would agree trivially.
			per := map[string]int{}
			for _, e := range events {
				if e.kind == "route" {
					per[e.addr]++
				}
			}
			if len(per) < 4 {
				t.Fatalf("picks went to %d servers only: %v", len(per), per)
			}
		})
	}
}

func addrsOf(events []simEvent) []string {
	seen := map[string]bool{}
	var out []string
	for i := range 64 {
		a := fmt.Sprintf("sim-%d:8000", i)
		for _, e := range events {
			if e.addr == a && !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}
