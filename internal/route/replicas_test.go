package route

import (
	"log/slog"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
)

// TestPeerDecisionBounds: a peer's decision is kept within this replica's
// bounds for the endpoint (its maxBlocks, the index size its own view of the
// endpoint gives), whatever the peer claims; one for an endpoint no scheduler
// here routes to is dropped.
func TestPeerDecisionBounds(t *testing.T) {
	g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true}})
	defer g.Close()
	sc := schedulerSpec("s", llama, "10.0.0.1:8000")
	capacity, blocks := int32(100), int32(64)
	sc.Prefix = &v1alpha1.PrefixSpec{CapacityBlocks: &capacity, MaxBlocks: &blocks}
	if err := g.Apply(&v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{sc}}}); err != nil {
		t.Fatal(err)
	}
	forged := func(n, from int) []uint64 {
		h := make([]uint64, n)
		for i := range h {
			h[i] = uint64(from + i + 1)
		}
		return h
	}
	g.PeerDecision(peers.Decision{Endpoint: "10.0.0.1:8000", Capacity: 1 << 30, Hashes: forged(10_000, 0)})
	if n := g.prefix.EntriesOf("10.0.0.1:8000"); n != 64 {
		t.Errorf("one forged decision of 10,000 blocks: %d held, want the 64 of maxBlocks", n)
	}
	for i := range 10 {
		g.PeerDecision(peers.Decision{Endpoint: "10.0.0.1:8000", Capacity: 1 << 30, Hashes: forged(64, 100_000*(i+1))})
	}
	if n := g.prefix.EntriesOf("10.0.0.1:8000"); n > 100 {
		t.Errorf("after 11 decisions the index holds %d blocks, over its capacity of 100", n)
	}
	g.PeerDecision(peers.Decision{Endpoint: "10.0.0.9:8000", Hashes: forged(5, 0)})
	if n := g.prefix.EntriesOf("10.0.0.9:8000"); n != 0 {
		t.Errorf("a decision for an endpoint not routed here was kept (%d blocks)", n)
	}
}
