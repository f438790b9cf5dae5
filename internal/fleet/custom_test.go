package fleet

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// customConfig maps the names of the simulator's custom dialect, as a user
// would write them for a server of no known engine.
const customConfig = `apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: custom}
spec:
  schedulers:
  - name: myserver
    modelName: m
    endpoints: ["ADDR"]
    engineType: custom
    metrics:
      queue: {name: myserver_requests, labels: {state: pending}}
      running: {name: myserver_requests, labels: {state: active}}
      kvUsed: {name: myserver_kv_used_blocks}
      kvTotal: {name: myserver_kv_total_blocks}
      blockSize: {name: myserver_cache_info, label: block_size}
      numBlocks: {name: myserver_kv_total_blocks}
  - name: percent
    modelName: p
    endpoints: ["ADDR"]
    engineType: custom
    metrics:
      running: {name: myserver_requests, labels: {state: active}}
      kvUsage: {name: myserver_kv_usage_percent, scale: 0.01}
  bbr: {enabled: true}
`

// A server exporting only names of its own is scored through the metric map
// its configuration gives: from the file, through engine.MapFor, scraped over
// HTTP by the fleet.
func TestCustomMetricMap(t *testing.T) {
	s := simtest.Start(t, simserver.Options{Dialect: simserver.DialectCustom, Engine: sim.Config{GPU: "h100", ModelSize: "8b", MaxNumSeqs: 2, NumGPUBlocks: 4000}})
	cfg, err := config.Parse("custom.yaml", []byte(strings.ReplaceAll(customConfig, "ADDR", s.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	var maps []*engine.Map
	for _, sc := range cfg.Spec.Schedulers {
		m, err := engine.MapFor(sc.EngineType, sc.Metrics)
		if err != nil {
			t.Fatal(err)
		}
		maps = append(maps, m)
	}
	// One fleet per map (a fleet scrapes an address once), and one that
	// detects: no built-in map reads this server.
	snaps := make([]func() Snapshot, 3)
	for i, m := range append(maps, nil) {
		f := New(Config{Interval: 10 * time.Millisecond})
		defer f.Close()
		f.Sync(context.Background(), []Target{{Addr: s.Addr(), Map: m}})
		snaps[i] = func() Snapshot { return f.Snapshot([]string{s.Addr()})[0] }
	}
	custom, percent, detected := snaps[0], snaps[1], snaps[2]
	waittest.Until(t, 5*time.Second, "the first scrapes", func() bool { return custom().Scraped && percent().Scraped })
	if g := custom(); !g.Healthy || g.Dialect != engine.Custom || g.NumBlocks != 4000 || g.BlockSize != 16 || g.Missing != engine.SignalLoRA || g.Waiting != 0 || g.Running != 0 {
		t.Fatalf("idle, missing %v: %+v", g.Missing.Names(), g)
	}
	if g := percent(); !g.Healthy || g.Missing != engine.SignalQueue|engine.SignalBlocks|engine.SignalLoRA {
		t.Fatalf("percent map, missing %v: %+v", g.Missing.Names(), g)
	}
	wg := busy(s.Addr(), 5)
	waittest.Until(t, 5*time.Second, "load in the scraped metrics", func() bool {
		g, p := custom(), percent()
		// The two maps read the same cache: in blocks, and as a percentage.
		return g.Running == 2 && g.Waiting == 3 && g.KVUsage > 0 && p.Running == 2 && math.Abs(p.KVUsage-g.KVUsage) < 0.01
	})
	wg.Wait()
	waittest.Until(t, 5*time.Second, "the load to drain", func() bool { g := custom(); return g.Running == 0 && g.Waiting == 0 })
	if g := detected(); g.Healthy || !strings.Contains(g.LastError, "no known model-server metrics") {
		t.Fatalf("a built-in map read the custom server: %+v", g)
	}
}
