package route

import (
	"log/slog"
	"testing"
	"time"
)

// BenchmarkRequestAccounting is what a request's counting costs: the metrics
// and the load summary's window (count, TTFT, duration), from parallel
// goroutines as requests finish.
func BenchmarkRequestAccounting(b *testing.B) {
	g := New(Options{Logger: slog.New(slog.DiscardHandler)})
	defer g.Close()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g.count("llama", llama, "10.0.0.1:8000", "200")
			g.observeTTFT("llama", 30*time.Millisecond, true)
			g.observeDuration("llama", "200", 200*time.Millisecond)
		}
	})
}
