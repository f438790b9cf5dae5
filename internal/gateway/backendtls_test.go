package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/internal/host"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// backendTLSYAML: llama on good (and fallback), over TLS checked against
// caFile for the service name; qwen on a plain-HTTP server said to be https;
// "m3" on a server whose certificate another CA signed.
func backendTLSYAML(caFile, good, plain, wrong, fallback string) string {
	return fmt.Sprintf(`apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: tls}
spec:
  bbr: {enabled: true}
  gateway: {diagnostics: {expose: true}}
  schedulers:
  - name: llama
    modelName: %s
    endpoints: ["%s"]
    appProtocol: https
    backendTLS: {caFile: %q, serverName: vllm.models.svc}
  - name: qwen
    modelName: %s
    endpoints: ["%s"]
    appProtocol: https
    backendTLS: {caFile: %q}
  - name: m3
    modelName: m3
    endpoints: ["%s", "%s"]
    picker: least-request
    appProtocol: https
    backendTLS: {caFile: %q, serverName: vllm.models.svc}
`, llama, good, caFile, qwen, plain, caFile, wrong, fallback, caFile)
}

// TestBackendTLS runs kvgate serve in front of model servers that serve TLS:
// requests from the official SDK succeed and the endpoints' metrics are
// scraped over TLS; a certificate another CA signed, or a server that does
// not speak TLS, fails over to the next endpoint, and with none left is the
// usual 503 without Go's TLS text, the reason logged with the endpoint; a
// server re-issued by a new CA fails until the CA file is replaced, then
// works again without a restart; a CA file that goes bad refuses the reload,
// naming the field, while the last configuration serves.
func TestBackendTLS(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	caA, caB := simtest.NewCA(t, "models-a"), simtest.NewCA(t, "models-b")
	simtest.WriteFile(t, caFile, caA.PEM)
	var cert atomic.Pointer[tls.Certificate]
	c := caA.Issue(t, "vllm.models.svc")
	cert.Store(&c)
	good, goodAddr := startSim(t, llama, simserver.Options{TLS: &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }}})
	_, plainAddr := startSim(t, qwen, simserver.Options{})
	_, wrongAddr := startSim(t, "m3", simserver.Options{TLS: &tls.Config{Certificates: []tls.Certificate{caB.Issue(t, "vllm.models.svc")}}})
	_, fallbackAddr := startSim(t, "m3", simserver.Options{TLS: &tls.Config{Certificates: []tls.Certificate{caA.Issue(t, "vllm.models.svc")}}})

	path := filepath.Join(dir, "igwc.yaml")
	simtest.WriteFile(t, path, []byte(backendTLSYAML(caFile, goodAddr, plainAddr, wrongAddr, fallbackAddr)))
	var logs logtest.Buffer
	ready := make(chan host.Addrs, 1)
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, host.Options{ConfigPath: path, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second,
			Reload: hup, Ready: ready, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var addrs host.Addrs
	select {
	case addrs = <-ready:
	case err := <-done:
		done <- nil // for the cleanup
		t.Fatalf("Run: %v", err)
	}
	base := "http://" + addrs.API
	client := sdk(base)
	ask := func(model string) (string, error) {
		var ep string
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(3),
		}, servedBy(&ep))
		return ep, err
	}
	fleetView := func() map[string]route.EndpointView {
		resp, err := http.Get("http://" + addrs.Admin + "/debug/fleet")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v []route.SchedulerView
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		out := map[string]route.EndpointView{}
		for _, s := range v {
			for _, e := range s.Endpoints {
				out[e.Address] = e
			}
		}
		return out
	}
	// refused checks the client's answer when no endpoint could serve: the
	// usual 503, nothing of TLS or of the address in it, and the reason in
	// the log with the endpoint.
	refused := func(t *testing.T, model, addr, reason string) {
		t.Helper()
		_, err := ask(model)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("SDK error %v; want a 503", err)
		}
		resp, raw, e := call(t, "POST", base+"/v1/chat/completions", chat(model))
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(e.Error.Message, "no endpoint could serve the request; retry later (request id ") {
			t.Errorf("%d %s", resp.StatusCode, raw)
		}
		for _, leak := range []string{"x509", "tls", "TLS", "certificate", "handshake", addr} {
			if strings.Contains(string(raw), leak) {
				t.Errorf("the client's answer carries %q: %s", leak, raw)
			}
		}
		refusedLogged(t, &logs, addr, reason)
	}

	t.Run("served and scraped over TLS", func(t *testing.T) {
		if ep, err := ask(llama); err != nil || ep != goodAddr {
			t.Fatalf("served by %q: %v", ep, err)
		}
		stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5),
		})
		chunks := 0
		for stream.Next() {
			chunks++
		}
		if err := stream.Err(); err != nil || chunks == 0 {
			t.Fatalf("stream: %d chunks, %v", chunks, err)
		}
		waittest.Until(t, 10*time.Second, "the endpoint scraped over TLS", func() bool {
			e := fleetView()[goodAddr]
			return e.Scraped && e.Healthy && !e.Stale && e.Dialect == "vllm"
		})
		if good.Scrapes() == 0 {
			t.Error("the server counted no scrape")
		}
	})

	t.Run("a certificate from another CA fails over", func(t *testing.T) {
		for range 10 {
			if ep, err := ask("m3"); err != nil || ep != fallbackAddr {
				t.Fatalf("served by %q: %v", ep, err)
			}
		}
		if n := promtest.Value(t, scraped(t, "http://"+addrs.Admin+"/metrics"), "kvgate_retries_total", "scheduler", "m3", "reason", "connect"); n < 1 {
			t.Errorf("retries counted: %v", n)
		}
		refusedLogged(t, &logs, wrongAddr, "certificate signed by unknown authority")
	})

	t.Run("a plain-HTTP server behind https", func(t *testing.T) {
		refused(t, qwen, plainAddr, "does not look like a TLS handshake")
		if e := fleetView()[plainAddr]; e.Healthy || !strings.Contains(e.LastError, "TLS") {
			t.Errorf("/debug/fleet: %+v", e)
		}
	})

	t.Run("the server re-issued by another CA", func(t *testing.T) {
		c := caB.Issue(t, "vllm.models.svc")
		cert.Store(&c)
		// A restart of the server: the gateway's connections go.
		if err := good.SetFaults(simserver.Faults{RefuseConnections: true}); err != nil {
			t.Fatal(err)
		}
		if err := good.SetFaults(simserver.Faults{}); err != nil {
			t.Fatal(err)
		}
		refused(t, llama, goodAddr, "certificate signed by unknown authority")
	})

	t.Run("the CA file replaced", func(t *testing.T) {
		simtest.WriteFile(t, caFile, caB.PEM)
		waittest.Until(t, 10*time.Second, "requests served again", func() bool { _, err := ask(llama); return err == nil })
		waittest.Until(t, 10*time.Second, "scrapes again", func() bool { e := fleetView()[goodAddr]; return e.Healthy && !e.Stale })
		if !strings.Contains(logs.String(), "backend CA bundle reloaded") {
			t.Error("the reload is not logged")
		}
	})

	t.Run("a CA file gone bad refuses the reload", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.pem")
		simtest.WriteFile(t, bad, []byte("not PEM"))
		simtest.WriteFile(t, path, []byte(backendTLSYAML(bad, goodAddr, plainAddr, wrongAddr, fallbackAddr)))
		waittest.Until(t, 10*time.Second, "the reload refused", func() bool {
			d := readDebugConfig(t, addrs.Admin)
			return !d.Accepted && strings.Contains(d.Error, "spec.schedulers[0].backendTLS.caFile") && strings.Contains(d.Error, "no PEM certificate")
		})
		if _, err := ask(llama); err != nil {
			t.Errorf("the last configuration no longer serves: %v", err)
		}
		resp, err := http.Get("http://" + addrs.Admin + "/debug/config")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.Contains(string(b), caFile) {
			t.Errorf("the active configuration is not the last accepted one: %s", b)
		}
	})
}

// refusedLogged waits for a log line naming the endpoint and the reason.
func refusedLogged(t *testing.T, logs *logtest.Buffer, addr, reason string) {
	t.Helper()
	waittest.Until(t, 5*time.Second, "the reason logged with the endpoint", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "endpoint="+addr) && strings.Contains(line, reason) {
				return true
			}
		}
		return false
	})
}

// scraped reads a Prometheus text exposition as a Gatherer.
func scraped(t *testing.T, url string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		resp, err := http.Get(url)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			return nil, err
		}
		out := make([]*dto.MetricFamily, 0, len(fams))
		for _, f := range fams {
			out = append(out, f)
		}
		return out, nil
	})
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
