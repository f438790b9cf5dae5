package gateway

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/tracing/tracingtest"
)

// baseBinEnv names another kvgate binary (say, a build from before tracing)
// that BenchmarkTracingOverhead measures beside this one's.
const baseBinEnv = "KVGATE_BENCH_BASE_BIN"

// BenchmarkTracingOverhead: BenchmarkThroughput's static upstream behind
// kvgate serve with tracing and the access log off, with the access log on,
// and with every request traced and exported (to a receiver in this process,
// which shares the machine), one after the other: requests/s and the gateway's
// CPU per request. With $KVGATE_BENCH_BASE_BIN, that build too.
func BenchmarkTracingOverhead(b *testing.B) {
	static := startHelper(b, staticUpstreamEnv+"=1")
	rcv := tracingtest.Start(b)
	bin := testenv.Kvgate(b)
	type path struct {
		name string
		gw   *proc
	}
	var paths []path
	if base := os.Getenv(baseBinEnv); base != "" {
		paths = append(paths, path{"base", startServeBin(b, base, static, nil)})
	}
	paths = append(paths,
		path{"off", startServeBin(b, bin, static, nil)},
		path{"access-log", startServeBin(b, bin, static, nil, "--access-log", "on")},
		path{"traced", startServeBin(b, bin, static, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + rcv.Endpoint, "OTEL_TRACES_SAMPLER=always_on"}, "--tracing")},
	)
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":1}`)
	const clients, seconds = 64, 10
	for b.Loop() {
		for _, p := range paths {
			var n, failures int64
			var mu sync.Mutex
			cpu0 := procCPU(b, p.gw.cmd.Process.Pid)
			deadline := time.Now().Add(seconds * time.Second)
			var wg sync.WaitGroup
			c := newClient()
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						_, err := send(c, "http://"+p.gw.addr+"/v1/completions", body, time.Now())
						mu.Lock()
						if err != nil {
							failures++
						} else {
							n++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if failures > 0 {
				b.Fatalf("%s: %d requests failed", p.name, failures)
			}
			b.ReportMetric(float64(n)/seconds, p.name+"-req/s")
			b.ReportMetric((procCPU(b, p.gw.cmd.Process.Pid)-cpu0)/float64(n)*1e6, p.name+"-cpu-us/req")
		}
	}
	if len(rcv.Spans(b)) == 0 {
		b.Fatal("the traced gateway exported no span")
	}
}

// startServeBin runs bin's kvgate serve over upstream with env added and
// extra flags; its output (the access log included) is read and dropped.
func startServeBin(b *testing.B, bin, upstream string, env []string, extra ...string) *proc {
	cfg := filepath.Join(b.TempDir(), "igwc.yaml")
	doc := fmt.Sprintf("apiVersion: gateway.kvgate.io/v1alpha1\nkind: InferenceGatewayConfig\nmetadata: {name: bench}\nspec:\n  schedulers:\n  - {name: p, modelName: m, endpoints: [%q]}\n", upstream)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-level", "info"}, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), " api="); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return &proc{cmd: cmd, addr: strings.Fields(after)[0]}
		}
	}
	b.Fatalf("kvgate serve %v exited before serving", extra)
	return nil
}
