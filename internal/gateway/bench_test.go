package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/procstat"
	"github.com/kvgate/kvgate/internal/testenv"
)

// The benchmarks here run `kvgate sim` and `kvgate serve` as their own processes,
// the way they are deployed, and drive them from the benchmark process over
// loopback. Every figure is measured side by side with a direct connection to the
// same simulated server in the same run. docs/benchmarks.md quotes them.

// proc is a started kvgate process.
type proc struct {
	cmd  *exec.Cmd
	addr string
}

// startProc runs kvgate with args and waits for a line matching find, which
// extracts the address it serves on.
func startProc(b *testing.B, find func(line string) (string, bool), args ...string) *proc {
	cmd := exec.Command(testenv.Kvgate(b), args...)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := find(sc.Text()); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return &proc{cmd: cmd, addr: addr}
		}
	}
	b.Fatalf("kvgate %v exited before serving", args)
	return nil
}

// benchPair starts one simulated H100 server and a gateway in front of it.
func benchPair(b *testing.B) (sim, gw *proc) {
	sim = startProc(b, func(l string) (string, bool) {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "on" {
			return strings.TrimPrefix(f[5], "http://"), true
		}
		return "", false
	}, "sim", "--listen", "127.0.0.1:0", "--model", "m", "--gpu", "h100", "--model-size", "8b", "--log-level", "warn")
	return sim, startGatewayProc(b, sim.addr)
}

// startGatewayProc runs kvgate serve with one scheduler over upstream.
func startGatewayProc(b *testing.B, upstream string) *proc {
	cfg := filepath.Join(b.TempDir(), "igwc.yaml")
	doc := fmt.Sprintf("apiVersion: gateway.kvgate.io/v1alpha1\nkind: InferenceGatewayConfig\nmetadata: {name: bench}\nspec:\n  schedulers:\n  - {name: p, modelName: m, endpoints: [%q]}\n", upstream)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	return startProc(b, func(l string) (string, bool) {
		_, after, ok := strings.Cut(l, " api=")
		if !ok {
			return "", false
		}
		return strings.Fields(after)[0], true
	}, "serve", "--config", cfg, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-level", "info")
}

// startHelper runs this test binary as a helper process (see TestMain) with env
// set, and returns the address it prints.
func startHelper(b *testing.B, env string) string {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), env)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		b.Fatal("helper did not start")
	}
	return strings.TrimSpace(sc.Text())
}

func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 0, DisableCompression: true}}
}

// timing is one request's latencies from its scheduled start.
type timing struct{ ttfb, total time.Duration }

// send posts body to url and times the first byte and the end of the response.
func send(c *http.Client, url string, body []byte, start time.Time) (timing, error) {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return timing{}, err
	}
	defer resp.Body.Close()
	var t timing
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	t.ttfb = time.Since(start)
	for err == nil && n >= 0 {
		n, err = resp.Body.Read(buf)
	}
	t.total = time.Since(start)
	if resp.StatusCode != 200 {
		return t, fmt.Errorf("status %d", resp.StatusCode)
	}
	if !errors.Is(err, io.EOF) {
		return t, err
	}
	return t, nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkAddedLatency: 1,000 small streaming requests/s through the gateway and
// 1,000/s straight to the same simulated server, interleaved, open loop (latency
// counts from each request's scheduled time, so a stall is not hidden).
func BenchmarkAddedLatency(b *testing.B) {
	sim, gw := benchPair(b)
	benchAddedLatency(b, sim.addr, gw.addr)
}

// BenchmarkAddedLatencyStdlibProxy is the same measurement with the standard
// library's httputil.ReverseProxy, doing nothing but proxying, in kvgate's place:
// the floor an extra Go HTTP hop costs on this machine.
func BenchmarkAddedLatencyStdlibProxy(b *testing.B) {
	sim, _ := benchPair(b)
	benchAddedLatency(b, sim.addr, startHelper(b, stdlibProxyEnv+"="+sim.addr))
}

// BenchmarkAddedLatencyTCPRelay puts a bare TCP relay (a goroutine copying each
// way, no HTTP at all) in kvgate's place: what one more process hop costs here
// before any proxy does any work.
func BenchmarkAddedLatencyTCPRelay(b *testing.B) {
	sim, _ := benchPair(b)
	benchAddedLatency(b, sim.addr, startHelper(b, tcpRelayEnv+"="+sim.addr))
}

func benchAddedLatency(b *testing.B, direct, proxy string) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"ignore_eos":true,"stream":true}`)
	const rate, seconds = 1000, 10
	for b.Loop() {
		d, v := openLoop(b, "http://"+direct, "http://"+proxy, body, rate, seconds)
		report(b, "total", d, v, func(t timing) time.Duration { return t.total })
	}
}

// stdlibProxyEnv makes the test binary run a plain httputil.ReverseProxy to the
// address it holds, print its own address and serve (see TestMain).
const stdlibProxyEnv = "KVGATE_BENCH_STDLIB_PROXY"

// staticUpstreamEnv makes the test binary serve one fixed small completion for
// every request: an upstream that costs next to nothing, to find the gateway's own
// limit.
const staticUpstreamEnv = "KVGATE_BENCH_STATIC_UPSTREAM"

// tcpRelayEnv makes the test binary relay every connection it accepts to the
// address it holds, byte for byte (see TestMain).
const tcpRelayEnv = "KVGATE_BENCH_TCP_RELAY"

func TestMain(m *testing.M) {
	if os.Getenv(staticUpstreamEnv) != "" {
		body := []byte(`{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" hi","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Println(ln.Addr().String())
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		}))
		os.Exit(0)
	}
	if upstream := os.Getenv(tcpRelayEnv); upstream != "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Println(ln.Addr().String())
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			go func() {
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					_ = c.Close()
					return
				}
				go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
				_, _ = io.Copy(c, u)
				_ = c.Close()
			}()
		}
	}
	if upstream := os.Getenv(stdlibProxyEnv); upstream != "" {
		p := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: upstream})
		p.FlushInterval = -1
		p.Transport = &http.Transport{MaxIdleConnsPerHost: 4096}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Println(ln.Addr().String())
		_ = http.Serve(ln, p)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// openLoop sends rate requests/s to each base for seconds, alternating, and
// returns the timings of each.
func openLoop(b *testing.B, directBase, viaBase string, body []byte, rate, seconds int) (direct, via []timing) {
	c1, c2 := newClient(), newClient()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failures int
	interval := time.Second / time.Duration(2*rate)
	// Warm both paths' connection pools.
	for range 50 {
		_, _ = send(c1, directBase+"/v1/chat/completions", body, time.Now())
		_, _ = send(c2, viaBase+"/v1/chat/completions", body, time.Now())
	}
	start := time.Now()
	for i := range 2 * rate * seconds {
		at := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		toGateway := i%2 == 1
		wg.Go(func() {
			c, base := c1, directBase
			if toGateway {
				c, base = c2, viaBase
			}
			t, err := send(c, base+"/v1/chat/completions", body, at)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures++
				return
			}
			if toGateway {
				via = append(via, t)
			} else {
				direct = append(direct, t)
			}
		})
	}
	wg.Wait()
	if failures > 0 {
		b.Fatalf("%d requests failed", failures)
	}
	return direct, via
}

// report states p50 and p99 of both paths and what the gateway added.
func report(b *testing.B, what string, direct, via []timing, pick func(timing) time.Duration) {
	d, v := make([]time.Duration, len(direct)), make([]time.Duration, len(via))
	for i, t := range direct {
		d[i] = pick(t)
	}
	for i, t := range via {
		v[i] = pick(t)
	}
	for _, p := range []float64{50, 99} {
		dp, vp := percentile(d, p), percentile(v, p)
		b.ReportMetric(msf(dp), fmt.Sprintf("direct-%s-p%.0f-ms", what, p))
		b.ReportMetric(msf(vp), fmt.Sprintf("gateway-%s-p%.0f-ms", what, p))
		b.ReportMetric(msf(vp-dp), fmt.Sprintf("added-%s-p%.0f-ms", what, p))
	}
	b.ReportMetric(float64(len(via)), "requests-per-path")
}

// BenchmarkLargePromptTTFB: 32 clients through the gateway and 32 straight to the
// server, each sending a 256 KB prompt whose model field comes last (as the
// OpenAI SDKs write it, so the gateway must read the whole body to route) every
// 250 ms, for 10 s. The prompt repeats, so the server answers from its prefix cache
// and the first byte measures transport, not prefill; the pause keeps the two cores
// from saturating, which would measure the machine's queue instead.
func BenchmarkLargePromptTTFB(b *testing.B) {
	sim, gw := benchPair(b)
	var content strings.Builder
	for content.Len() < 256<<10 {
		content.WriteString("The committee reviewed every clause of the agreement in detail. ")
	}
	body := []byte(`{"messages":[{"role":"user","content":"` + content.String() + `"}],"max_tokens":1,"stream":true,"model":"m"}`)
	const clients, seconds = 32, 10
	for b.Loop() {
		var mu sync.Mutex
		var direct, via []timing
		var failures int
		// Warm the prefix cache and the pools.
		_, _ = send(newClient(), "http://"+sim.addr+"/v1/chat/completions", body, time.Now())
		deadline := time.Now().Add(seconds * time.Second)
		var wg sync.WaitGroup
		for i := range 2 * clients {
			wg.Go(func() {
				c, base := newClient(), "http://"+sim.addr
				if i%2 == 1 {
					base = "http://" + gw.addr
				}
				time.Sleep(time.Duration(i) * 250 * time.Millisecond / (2 * clients))
				for time.Now().Before(deadline) {
					next := time.Now().Add(250 * time.Millisecond)
					t, err := send(c, base+"/v1/chat/completions", body, time.Now())
					time.Sleep(time.Until(next))
					mu.Lock()
					switch {
					case err != nil:
						failures++
					case i%2 == 1:
						via = append(via, t)
					default:
						direct = append(direct, t)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if failures > 0 {
			b.Fatalf("%d requests failed", failures)
		}
		report(b, "ttfb", direct, via, func(t timing) time.Duration { return t.ttfb })
	}
}

// BenchmarkThroughput: small non-streaming requests, 64 clients in a closed loop
// for 10 s per path: straight to a simulated server, through the gateway to it, and
// through the gateway to an upstream that answers at once (the gateway's own limit
// on this machine, shared with the clients and the upstream). It also reports the
// gateway's CPU time per request, from /proc.
func BenchmarkThroughput(b *testing.B) {
	sim, gw := benchPair(b)
	static := startHelper(b, staticUpstreamEnv+"=1")
	gwStatic := startGatewayProc(b, static)
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":1}`)
	const clients, seconds = 64, 10
	for b.Loop() {
		for _, path := range []struct {
			name, base string
			gw         *proc
		}{
			{"sim-direct", "http://" + sim.addr, nil},
			{"sim-gateway", "http://" + gw.addr, gw},
			{"static-direct", "http://" + static, nil},
			{"static-gateway", "http://" + gwStatic.addr, gwStatic},
		} {
			var n, failures int64
			var mu sync.Mutex
			var cpu0 float64
			if path.gw != nil {
				cpu0 = procCPU(b, path.gw.cmd.Process.Pid)
			}
			deadline := time.Now().Add(seconds * time.Second)
			var wg sync.WaitGroup
			c := newClient()
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						_, err := send(c, path.base+"/v1/completions", body, time.Now())
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
				b.Fatalf("%s: %d requests failed", path.name, failures)
			}
			b.ReportMetric(float64(n)/seconds, path.name+"-req/s")
			if path.gw != nil {
				used := procCPU(b, path.gw.cmd.Process.Pid) - cpu0
				b.ReportMetric(used/float64(n)*1e6, path.name+"-cpu-us/req")
			}
		}
	}
}

// BenchmarkMemory: the gateway process's resident memory with 1,000 idle
// keep-alive client connections, then with 1,000 streams in flight, per
// connection and per stream.
func BenchmarkMemory(b *testing.B) {
	sim, gw := benchPair(b)
	const n = 1000
	for b.Loop() {
		base := rss(b, gw.cmd.Process.Pid)
		// Idle connections: each client makes one request and keeps its connection.
		var conns []*http.Client
		for range n {
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			if _, err := send(c, "http://"+gw.addr+"/v1/models", nil, time.Now()); err != nil && !strings.Contains(err.Error(), "status 405") {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		time.Sleep(500 * time.Millisecond)
		idle := rss(b, gw.cmd.Process.Pid)
		b.ReportMetric(float64(idle-base)/n, "bytes/idle-conn")
		for _, c := range conns {
			c.CloseIdleConnections()
		}

		// Requests in flight: long generations held open (the server runs 256 at a
		// time; the rest wait in its queue, in flight all the same for the gateway).
		ctx, cancel := context.WithCancel(context.Background())
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":20000,"ignore_eos":true,"stream":true}`)
		before := rss(b, gw.cmd.Process.Pid)
		var wg sync.WaitGroup
		c := newClient()
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.addr+"/v1/chat/completions", bytes.NewReader(body))
				resp, err := c.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
			})
		}
		time.Sleep(3 * time.Second)
		busy := rss(b, gw.cmd.Process.Pid)
		b.ReportMetric(float64(busy-before)/n, "bytes/in-flight-stream")
		cancel()
		wg.Wait()
		_ = sim
	}
}

func procCPU(b *testing.B, pid int) float64 {
	v, err := procstat.CPUSeconds(pid)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

func rss(b *testing.B, pid int) int64 {
	v, err := procstat.RSSBytes(pid)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// freePort returns a loopback address nothing listens on, for a proxy that
// cannot report the port it bound.
func freePort(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// startPeer runs another proxy (found on PATH, or the benchmark is skipped) with
// the configuration conf renders for its listen address and the simulated
// server, and returns the address it serves on.
func startPeer(b *testing.B, sim, name, confName string, conf func(addr, dir string) string, args func(conf, dir string) []string) string {
	path, err := exec.LookPath(name)
	if err != nil {
		b.Skipf("%s is not installed (apt-get install %s)", name, name)
	}
	addr, dir := freePort(b), b.TempDir()
	file := filepath.Join(dir, confName)
	if err := os.WriteFile(file, []byte(conf(addr, dir)), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(path, args(file, dir)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// SIGTERM, not a kill: nginx's master takes its workers down with it only
	// when it is asked to stop.
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	for range 250 {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return addr
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("%s did not start listening on %s", name, addr)
	return ""
}

// BenchmarkAddedLatencyHAProxy puts HAProxy (HTTP mode, keep-alive to the server)
// in kvgate's place: what a mature C proxy adds on the same machine.
func BenchmarkAddedLatencyHAProxy(b *testing.B) {
	sim, _ := benchPair(b)
	addr := startPeer(b, sim.addr, "haproxy", "haproxy.cfg", func(addr, _ string) string {
		return fmt.Sprintf(`global
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend f
  bind %s
  default_backend s
backend s
  http-reuse always
  server sim %s
`, addr, sim.addr)
	}, func(conf, _ string) []string { return []string{"-f", conf, "-db"} })
	benchAddedLatency(b, sim.addr, addr)
}

// BenchmarkAddedLatencyNginx puts nginx (two workers, unbuffered both ways,
// keep-alive to the server) in kvgate's place.
func BenchmarkAddedLatencyNginx(b *testing.B) {
	sim, _ := benchPair(b)
	addr := startPeer(b, sim.addr, "nginx", "nginx.conf", func(addr, dir string) string {
		return fmt.Sprintf(`daemon off;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 8000; }
http {
  access_log off;
  client_body_temp_path %[1]s;
  proxy_temp_path %[1]s;
  upstream sim { server %[2]s; keepalive 1024; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
`, dir, sim.addr, addr)
	}, func(conf, dir string) []string { return []string{"-c", conf, "-p", dir} })
	benchAddedLatency(b, sim.addr, addr)
}
