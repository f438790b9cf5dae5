package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// BenchmarkSimScale replays 100,000 requests on 100 H100 servers (70% of their
// capacity, chat traffic) in virtual time under kvgate's picker; the target is
// under 60 s on 2 cores. KVGATE_SCALE=500x1000000 runs another size.
func BenchmarkSimScale(b *testing.B) {
	servers, requests := 100, 100_000
	if v := os.Getenv("KVGATE_SCALE"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &servers, &requests); err != nil {
			b.Fatalf("KVGATE_SCALE=%q: want SERVERSxREQUESTS", v)
		}
	}
	fleet := simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{{Name: "h100", Listen: "127.0.0.1:20000", Replicas: servers,
		GPU: "h100", Model: llama8b, ModelSize: "8b"}}}
	tr, err := workload.Generate(workload.Spec{Kind: "poisson", Seed: 1, Requests: requests, Rate: 0.7 * 31.5 * float64(servers)})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		start := time.Now()
		recs, _, err := RunSim(context.Background(), SimOptions{Fleet: fleet, Policy: "kvgate", Seed: 1}, tr)
		if err != nil {
			b.Fatal(err)
		}
		r := report.Summarize("scale", "kvgate", "sim", recs)
		b.ReportMetric(time.Since(start).Seconds(), "wall-s")
		b.ReportMetric(float64(r.Requests)/time.Since(start).Seconds(), "requests/s")
		b.Logf("%d servers × %s requests: %.1f s of virtual time in %.1f s, TTFT p95 %.1f ms, errors %d",
			servers, strconv.Itoa(requests), r.DurationS, time.Since(start).Seconds(), r.TTFTP95ms, r.Errors)
	}
}
