package simserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/procstat"
)

// BenchmarkFleetCPU measures what the simulator itself costs: one `kvgate sim`
// process serving 16 H100 servers while 1,000 streaming clients keep requests in
// flight; it reports the process's CPU in cores (utime+stime from /proc over wall
// time) and the tokens it streamed per second. The binary runs in its own process
// so that the clients' CPU is not counted. docs/benchmarks.md quotes it.
func BenchmarkFleetCPU(b *testing.B) {
	const servers, streams = 16, 1000
	dir := b.TempDir()
	bin := filepath.Join(dir, "kvgate")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kvgate/kvgate/cmd/kvgate").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	var fleet strings.Builder
	fleet.WriteString("servers:\n")
	for i := range servers {
		fmt.Fprintf(&fleet, "- {name: s%d, listen: \"127.0.0.1:0\", gpu: h100, model: m, modelSize: 8b}\n", i)
	}
	fleetFile := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte(fleet.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "sim", "--fleet", fleetFile, "--admin", "127.0.0.1:0", "--log-level", "warn")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var addrs []string
	sc := bufio.NewScanner(stdout)
	for len(addrs) < servers && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 5 && f[4] == "on" {
			addrs = append(addrs, strings.TrimPrefix(f[5], "http://"))
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if len(addrs) != servers {
		b.Fatalf("fleet printed %d addresses", len(addrs))
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}}
	body, _ := json.Marshal(map[string]any{
		"model": "m", "max_tokens": 200, "ignore_eos": true, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": strings.Repeat("Tell me about the history of tea. ", 25)}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var tokens atomic.Int64
	var errs atomic.Int64
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			url := "http://" + addrs[i%servers] + "/v1/chat/completions"
			buf := make([]byte, 32<<10)
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				// Each content event carries one token; an event split across two
				// reads is missed, which undercounts slightly.
				for {
					n, err := resp.Body.Read(buf)
					tokens.Add(int64(bytes.Count(buf[:n], []byte(`"content":" `))))
					if err != nil {
						break
					}
				}
				resp.Body.Close()
			}
		})
	}
	time.Sleep(3 * time.Second) // every stream started, batches at steady state
	for b.Loop() {
		cpu0, t0, tok0 := procCPU(b, cmd.Process.Pid), time.Now(), tokens.Load()
		time.Sleep(10 * time.Second)
		cpu1, t1, tok1 := procCPU(b, cmd.Process.Pid), time.Now(), tokens.Load()
		wall := t1.Sub(t0).Seconds()
		b.ReportMetric((cpu1-cpu0)/wall, "sim-cores")
		b.ReportMetric(float64(tok1-tok0)/wall, "tokens/s")
	}
	cancel()
	wg.Wait()
	if n := errs.Load(); n > 0 {
		b.Fatalf("%d requests failed", n)
	}
}

func procCPU(b *testing.B, pid int) float64 {
	v, err := procstat.CPUSeconds(pid)
	if err != nil {
		b.Fatal(err)
	}
	return v
}
