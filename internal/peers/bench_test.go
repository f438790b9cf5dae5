package peers

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/procstat"
	"github.com/kvgate/kvgate/internal/redistest"
)

// timing is a State that notes when each decision arrived.
type timing struct {
	state
	mu      sync.Mutex
	arrived map[uint64]time.Time
}

func (s *timing) PeerDecision(d Decision) {
	s.mu.Lock()
	s.arrived[d.Hashes[0]] = time.Now()
	s.mu.Unlock()
}

// BenchmarkPropagation measures the time from one replica's decision to its
// peer applying it, through a real Redis on loopback, at a given decision
// rate over both (a sparse one: every decision goes at once; 1,000 a second:
// they gather for the flush), and the CPU the two replicas' sync costs, this
// process's CPU time per second of run (the Redis server's not included).
//
//	go test -run '^$' -bench Propagation -benchtime 1x ./internal/peers/
func BenchmarkPropagation(b *testing.B) {
	for _, tc := range []struct {
		name string
		rate int // decisions a second
	}{{"sparse-50/s", 50}, {"1000/s", 1000}} {
		b.Run(tc.name, func(b *testing.B) {
			r := redistest.Start(b)
			sb := &timing{state: *newState(), arrived: map[uint64]time.Time{}}
			mk := func(name string, st State) *Mesh {
				m := New(Config{Addr: r.Addr(), Cluster: "bench", Replica: name, Registerer: prometheus.NewRegistry()}, st)
				m.Start(context.Background())
				b.Cleanup(m.Close)
				return m
			}
			a := mk("a", newState())
			mk("b", sb)
			time.Sleep(200 * time.Millisecond)
			hashes := make([]uint64, 32) // a 2 KB prompt's blocks
			sent := map[uint64]time.Time{}
			n := tc.rate * 3 // three seconds
			cpu0, _ := procstat.CPUSeconds(os.Getpid())
			start := time.Now()
			for i := range n {
				if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(tc.rate))); d > 0 {
					time.Sleep(d)
				}
				hashes[0] = uint64(i + 1)
				sent[hashes[0]] = time.Now()
				a.Decided(Decision{Endpoint: "10.0.0.1:8000", Capacity: 1000, Hashes: hashes})
			}
			elapsed := time.Since(start)
			cpu1, _ := procstat.CPUSeconds(os.Getpid())
			time.Sleep(200 * time.Millisecond)
			var lags []time.Duration
			sb.mu.Lock()
			for h, at := range sent {
				if got, ok := sb.arrived[h]; ok {
					lags = append(lags, got.Sub(at))
				}
			}
			sb.mu.Unlock()
			if len(lags) < n {
				b.Fatalf("%d of %d decisions arrived", len(lags), n)
			}
			slices.Sort(lags)
			q := func(p float64) float64 { return float64(lags[int(p*float64(len(lags)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(1000*(cpu1-cpu0)/elapsed.Seconds(), "cpu-ms/s")
		})
	}
}
