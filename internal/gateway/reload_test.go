package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvgate/kvgate/internal/host"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

func configYAML(weightQueue int, endpoints ...string) string {
	return fmt.Sprintf(`apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: reload}
spec:
  schedulers:
  - name: p
    modelName: %s
    endpoints: ["%s"]
    weights: {queue: %d, kvCache: 2, prefix: 3}
  gateway:
    diagnostics: {expose: true}
`, llama, strings.Join(endpoints, `", "`), weightQueue)
}

// writeAtomically replaces a file the way editors and ConfigMaps do.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type debugConfig struct {
	Active   string `json:"active"`
	Accepted bool   `json:"lastReloadAccepted"`
	Error    string `json:"lastReloadError"`
	When     string `json:"lastReload"`
}

func readDebugConfig(t *testing.T, admin string) debugConfig {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d debugConfig
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReloadWithoutFailedRequests changes weights and endpoints under steady
// traffic, by file change and by signal, including an invalid file in between:
// no request fails, the invalid file is reported and the old configuration serves.
func TestReloadWithoutFailedRequests(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	_, b := startSim(t, llama, simserver.Options{})
	path := filepath.Join(t.TempDir(), "igwc.yaml")
	writeAtomically(t, path, configYAML(2, a))
	ready := make(chan host.Addrs, 1)
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, host.Options{ConfigPath: path, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second,
			Reload: hup, Ready: ready, Logger: quiet})
	}()
	addrs := <-ready

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
				resp, err := http.Post("http://"+addrs.API+"/v1/chat/completions", "application/json", strings.NewReader(chat(llama, `"stream":true`)))
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
	writeAtomically(t, path, configYAML(7, a, b))
	waittest.Until(t, 5*time.Second, "the file change to apply", func() bool {
		return strings.Contains(readDebugConfig(t, addrs.Admin).Active, "queue: 7")
	})
	waittest.Until(t, 5*time.Second, "traffic on the added endpoint", seenB.Load)

	writeAtomically(t, path, strings.Replace(configYAML(9, a, b), "weights:", "weightz:", 1))
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
			strings.NewReader(chat(llama, `"stream":true`, `"max_tokens":100`, `"ignore_eos":true`)))
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
	cancel()
	if n := <-streamDone; n < 100*100 {
		t.Errorf("in-flight stream cut by shutdown after %d bytes", n)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// drainBody reads a response to its end and returns how many bytes it had.
func drainBody(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}
