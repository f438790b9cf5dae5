package host_test

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// writeConfig replaces the configuration file the way editors and ConfigMaps
// do.
func writeConfig(t *testing.T, path, content string) {
	t.Helper()
	simtest.WriteFile(t, path, []byte(content))
}

// TestReloadWithoutFailedRequests changes weights and endpoints under steady
// traffic, by file change and by signal, including an invalid file in between:
// no request fails, the invalid file is reported and the old configuration serves.
func TestReloadWithoutFailedRequests(t *testing.T) {
	a, b := startSim(t, llama, simserver.Options{}).Addr(), startSim(t, llama, simserver.Options{}).Addr()
	path := filepath.Join(t.TempDir(), "igwc.yaml")
	writeConfig(t, path, configYAML(2, a))
	hup := make(chan os.Signal, 1)
	s := serveFile(t, path, hup)
	addrs := s.Addrs

	var ok, failed atomic.Int64
	var seenB atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post("http://"+addrs.API+"/v1/chat/completions", "application/json", strings.NewReader(chat(llama, 4, true)))
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = drainBody(resp)
				if resp.StatusCode != 200 {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				if resp.Header.Get("X-Kvgate-Endpoint") == b {
					seenB.Store(true)
				}
			}
		})
	}

	time.Sleep(200 * time.Millisecond)
	writeConfig(t, path, configYAML(7, a, b))
	waittest.Until(t, 5*time.Second, "the file change to apply", func() bool {
		return strings.Contains(readDebugConfig(t, addrs.Admin).Active, "queue: 7")
	})
	waittest.Until(t, 5*time.Second, "traffic on the added endpoint", seenB.Load)

	writeConfig(t, path, strings.Replace(configYAML(9, a, b), "weights:", "weightz:", 1))
	waittest.Until(t, 5*time.Second, "the invalid file to be reported", func() bool {
		d := readDebugConfig(t, addrs.Admin)
		return !d.Accepted && strings.Contains(d.Error, "unknown field") && strings.Contains(d.Active, "queue: 7")
	})
	// A SIGHUP re-reads the same invalid file: rejected again, at a new time.
	before := readDebugConfig(t, addrs.Admin).When
	hup <- os.Interrupt
	waittest.Until(t, 5*time.Second, "the SIGHUP to be handled", func() bool { return readDebugConfig(t, addrs.Admin).When != before })
	if d := readDebugConfig(t, addrs.Admin); d.Accepted || !strings.Contains(d.Active, "queue: 7") {
		t.Fatal("invalid file accepted on SIGHUP")
	}
	if err := os.WriteFile(path, []byte(configYAML(4, b)), 0o600); err != nil { // in place this time
		t.Fatal(err)
	}
	hup <- os.Interrupt
	waittest.Until(t, 5*time.Second, "the fixed file to apply", func() bool {
		d := readDebugConfig(t, addrs.Admin)
		return d.Accepted && strings.Contains(d.Active, "queue: 4")
	})
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() < 20 {
		t.Fatalf("%d requests failed, %d succeeded across the reloads", failed.Load(), ok.Load())
	}

	// Graceful shutdown: a stream in flight finishes; readiness fails at once.
	streamDone := make(chan int)
	go func() {
		resp, err := http.Post("http://"+addrs.API+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+llama+`","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":100,"ignore_eos":true}`))
		if err != nil {
			streamDone <- -1
			return
		}
		n, _ := drainBody(resp)
		streamDone <- int(n)
	}()
	waittest.Until(t, 5*time.Second, "the stream to be in flight", func() bool {
		resp, err := http.Get("http://" + addrs.Admin + "/debug/fleet")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `"inFlight": 1`)
	})
	s.Stop()
	if n := <-streamDone; n < 100*100 {
		t.Errorf("in-flight stream cut by shutdown after %d bytes", n)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// drainBody reads a response to its end and returns how many bytes it had.
func drainBody(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}

// TestDrain: on a stop signal /readyz fails at once while the listener keeps
// accepting for the pre-stop window (no connection refused, each response
// closes its connection); then streams get the drain timeout, and those still
// running end with an explicit SSE error event, not a bare EOF.
func TestDrain(t *testing.T) {
	// Streams that outlast the drain: thousands of tokens at the engine's pace.
	slow := startSim(t, llama, simserver.Options{}).Addr()
	path := filepath.Join(t.TempDir(), "igwc.yaml")
	writeConfig(t, path, configYAML(2, slow))
	o := fromFile(path)
	o.PreStop, o.DrainTimeout = time.Second, 2*time.Second
	s := servetest.Serve(t, o, gateway.Options{})
	addrs := s.Addrs
	api := "http://" + addrs.API + "/v1/chat/completions"
	type outcome struct {
		status     int
		last, conn string
		err        error
	}
	stream := func(out chan<- outcome) {
		// A fresh connection each: what a load balancer still sending opens.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Post(api, "application/json", strings.NewReader(`{"model":"`+llama+`","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":20000,"ignore_eos":true}`))
		if err != nil {
			out <- outcome{err: err}
			return
		}
		defer resp.Body.Close()
		o := outcome{status: resp.StatusCode, conn: resp.Header.Get("Connection")}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				o.last = line
			}
		}
		o.err = sc.Err()
		out <- o
	}
	results := make(chan outcome, 16)
	for range 4 {
		go stream(results)
	}
	time.Sleep(300 * time.Millisecond)
	s.Stop() // SIGTERM
	waittest.Until(t, time.Second, "/readyz to fail at the stop signal", func() bool {
		resp, err := http.Get("http://" + addrs.Admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	// Still sending during the pre-stop window.
	for range 4 {
		go stream(results)
		time.Sleep(100 * time.Millisecond)
	}
	for i := range 8 {
		select {
		case o := <-results:
			switch {
			case o.err != nil && o.status == 0:
				t.Errorf("stream %d: %v (connection refused during the pre-stop window?)", i, o.err)
			case o.status != 200:
				t.Errorf("stream %d: status %d", i, o.status)
			case !strings.Contains(o.last, "shutting down"):
				t.Errorf("stream %d ended without an error event: last line %q, err %v", i, o.last, o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a stream did not end")
		}
	}
	select {
	case <-s.Done():
		if err := s.Err(); err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}
