package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/procstat"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
)

// exporterEnv makes the test binary serve a simulated vLLM server's /metrics on
// that many loopback ports and print their addresses (see TestMain), so that a
// benchmark can measure the scraping side's CPU alone.
const exporterEnv = "KVGATE_BENCH_EXPORTERS"

func TestMain(m *testing.M) {
	if n, _ := strconv.Atoi(os.Getenv(exporterEnv)); n > 0 {
		serveExporters(n)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveExporters answers /metrics on n ports with the exposition of a busy
// simulated vLLM server (histograms included, as a real one exports).
func serveExporters(n int) {
	s, err := simserver.New(simserver.Options{Model: "meta-llama/Llama-3.1-8B-Instruct", Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})
	if err != nil {
		os.Exit(1)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := padExposition(rec.Body.Bytes(), 40<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(body)
	})
	out := bufio.NewWriter(os.Stdout)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Fprintln(out, ln.Addr().String())
		go func() { _ = http.Serve(ln, h) }()
	}
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent goes
}

// padExposition adds latency histograms in vLLM's naming until the exposition is
// size bytes: a real vLLM server exports about that much (a dozen histograms of
// twenty-odd buckets each, labelled by model and engine), the simulator less.
func padExposition(body []byte, size int) []byte {
	var b strings.Builder
	b.Write(body)
	for i := 0; b.Len() < size; i++ {
		name := fmt.Sprintf("vllm:request_latency_%d_seconds", i)
		fmt.Fprintf(&b, "# HELP %s Histogram of request latency.\n# TYPE %s histogram\n", name, name)
		for j, le := range []string{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"} {
			fmt.Fprintf(&b, "%s_bucket{engine=\"0\",le=\"%s\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d\n", name, le, 100*j)
		}
		fmt.Fprintf(&b, "%s_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1234.5\n", name)
		fmt.Fprintf(&b, "%s_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 2200\n", name)
	}
	return []byte(b.String())
}

// BenchmarkScrape256 measures what scraping 256 endpoints every 50 ms costs the
// gateway's process, in cores; the endpoints, each exporting 40 KB as a real vLLM
// server does, are served by another process.
func BenchmarkScrape256(b *testing.B) {
	const n = 256
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", exporterEnv, n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	var targets []Target
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "ready" {
		targets = append(targets, Target{Addr: strings.TrimSpace(sc.Text())})
	}
	if len(targets) != n {
		b.Fatalf("exporters: %d addresses", len(targets))
	}
	f := New(Config{})
	defer f.Close()
	f.Sync(context.Background(), targets)
	time.Sleep(time.Second) // connections up, first scrapes done
	for b.Loop() {
		cpu0, _ := procstat.CPUSeconds(os.Getpid())
		t0 := time.Now()
		time.Sleep(5 * time.Second)
		cpu1, _ := procstat.CPUSeconds(os.Getpid())
		b.ReportMetric((cpu1-cpu0)/time.Since(t0).Seconds(), "cores")
	}
	healthy := 0
	for _, s := range f.Snapshot(addrsOf(targets)) {
		if s.Healthy && !s.Stale {
			healthy++
		}
	}
	if healthy != n {
		b.Fatalf("%d of %d endpoints healthy and fresh", healthy, n)
	}
}

func addrsOf(ts []Target) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Addr
	}
	return out
}
