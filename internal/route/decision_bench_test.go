package route

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/prefix"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// BenchmarkDecision times one routing decision as serve makes it for an 8k-token
// chat prompt: hashing the prompt's head, the fleet snapshot, the prefix match
// across the scheduler and the weighted picker. The index holds the prompt's full
// prefix on four endpoints and a part of it on a quarter of the others. It reports
// the median and p99 of single decisions besides the mean. Each size runs with
// the default profile and with it less predictedLatency: the difference is that
// scorer's cost.
func BenchmarkDecision(b *testing.B) {
	chat, err := schedule.LookupProfile("chat")
	if err != nil {
		b.Fatal(err)
	}
	fixed := chat
	fixed.Weights = maps.Clone(chat.Weights)
	delete(fixed.Weights, "predictedLatency")
	for _, n := range []int{64, 1024} {
		for _, pr := range []struct {
			name    string
			profile *schedule.Profile
		}{{"chat", nil}, {"chat-fixed-speed", &fixed}} {
			b.Run(fmt.Sprintf("endpoints=%d/%s", n, pr.name), func(b *testing.B) { benchDecision(b, n, pr.profile) })
		}
	}
}

func benchDecision(b *testing.B, n int, profile *schedule.Profile) {
	p, fl, idx := decisionScheduler(b, n, profile)
	prompt := []byte(`[{"role":"system","content":"` + strings.Repeat("You answer questions about the attached contract. ", 700) + `"}]`)
	if len(prompt) < 32000 {
		b.Fatal("prompt shorter than 8k tokens")
	}
	prompt = prompt[:p.prefix.blockChars*p.prefix.maxBlocks] // what the scanner hands over
	seed := p.prefix.seeds[llama]
	full := prefix.Hashes(nil, prompt, p.prefix.blockChars, p.prefix.maxBlocks, seed)
	for i, e := range p.endpoints {
		switch {
		case i < 4:
			idx.Record(e.addr, full, 0)
		case i%4 == 0:
			idx.Record(e.addr, full[:i%len(full)], 0)
		}
	}
	req := schedule.Request{Model: llama, PromptTokens: 8000}
	hashes := make([]uint64, 0, prefix.DefaultMaxBlocks)
	times := make([]time.Duration, 0, 1<<16)
	sc := new(snapshotScratch)
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		hashes = prefix.Hashes(hashes[:0], prompt, p.prefix.blockChars, p.prefix.maxBlocks, seed)
		d := p.picker.Pick(req, p.snapshot(fl, idx, hashes, "", slots{}, nil, "", time.Now(), sc))
		if len(d.Ranked) == 0 || func() bool { v, _ := d.Ranked[0].Scores.Get("prefix"); return v != 1 }() {
			b.Fatalf("the prefix holders did not win: %+v", d.Ranked[0])
		}
		if len(times) < cap(times) {
			times = append(times, time.Since(t0))
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// decisionScheduler builds a scheduler of n endpoints with the default picker, a fleet that
// does not scrape (every endpoint reads as never scraped) and an empty index.
func decisionScheduler(b *testing.B, n int, profile *schedule.Profile) (*scheduler, *fleet.Fleet, *prefix.Index) {
	var addrs []string
	for i := range n {
		addrs = append(addrs, fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1))
	}
	sc := schedulerSpec("p", llama, addrs...)
	picker, err := newPicker(sc, profile, 1, telemetry.NewGateway().PluginTimer)
	if err != nil {
		b.Fatal(err)
	}
	p := &scheduler{name: "p", spec: sc, picker: picker,
		prefix: prefixConfig{blockChars: sc.PrefixBlockChars(), maxBlocks: sc.PrefixMaxBlocks(), capacity: sc.PrefixCapacity(),
			seeds: map[string]uint64{llama: prefix.Seed(llama, "")}}}
	for _, a := range addrs {
		p.endpoints = append(p.endpoints, &endpoint{addr: a})
	}
	return p, fleet.New(fleet.Config{}), prefix.New()
}
