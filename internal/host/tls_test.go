package host_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/certs/certstest"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

func tlsBlock(certFile, keyFile string) string {
	return fmt.Sprintf("  tls: {certFile: %q, keyFile: %q}\n", certFile, keyFile)
}

// TestTLSRotationUnderLoad: kvgate serve with spec.tls from files, under
// continuous traffic from the OpenAI SDK, on one long-lived HTTP/2
// connection and on a fresh connection per request, while the certificate
// files are replaced by one from another CA: no request fails, new
// connections get the new certificate, the open one goes on; a broken
// replacement then keeps the certificate serving and is counted.
func TestTLSRotationUnderLoad(t *testing.T) {
	a, b := startSim(t, llama, simserver.Options{}).Addr(), startSim(t, llama, simserver.Options{}).Addr()
	caOld, caNew := certstest.NewCA(t, "old CA"), certstest.NewCA(t, "new CA")
	dir := t.TempDir()
	first, second := caOld.Issue(t), caNew.Issue(t)
	certFile, keyFile := first.Write(t, dir)
	path := filepath.Join(dir, "igwc.yaml")
	simtest.WriteFile(t, path, []byte(configYAML(2, a, b)+tlsBlock(certFile, keyFile)))
	addrs := serveFile(t, path, nil).Addrs
	base := "https://" + addrs.API

	roots := certstest.Pool(caOld, caNew)
	var ok, failed atomic.Int64
	var seenNew atomic.Bool
	var failures sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	type worker struct {
		name   string
		client *http.Client
		dials  *atomic.Int64
	}
	var workers []worker
	for i := range 2 {
		var dials atomic.Int64
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		workers = append(workers, worker{fmt.Sprintf("h2 keep-alive %d", i), &http.Client{Transport: tr}, &dials})
	}
	for i := range 3 {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}
		workers = append(workers, worker{fmt.Sprintf("fresh connections %d", i), &http.Client{Transport: tr}, nil})
	}
	for _, w := range workers {
		defer w.client.CloseIdleConnections()
		wg.Go(func() {
			serial := ""
			client := sdk(base, option.WithHTTPClient(w.client), option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
				resp, err := next(r)
				if err == nil && resp.TLS != nil {
					serial = resp.TLS.PeerCertificates[0].SerialNumber.String()
					if w.dials != nil && resp.Proto != "HTTP/2.0" {
						err = fmt.Errorf("%s: %s, not HTTP/2", w.name, resp.Proto)
					}
				}
				return resp, err
			}))
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
					Model: llama, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(4)})
				if err != nil {
					failed.Add(1)
					failures.Store(err.Error(), w.name)
					continue
				}
				ok.Add(1)
				if serial == second.Serial.String() && w.dials == nil {
					seenNew.Store(true)
				}
			}
		})
	}
	waittest.Until(t, 10*time.Second, "traffic on the first certificate", func() bool { return ok.Load() >= 20 })
	second.Write(t, dir)
	waittest.Until(t, 10*time.Second, "a new connection to get the new certificate", seenNew.Load)
	before := ok.Load()
	waittest.Until(t, 10*time.Second, "traffic on the new certificate", func() bool { return ok.Load() >= before+20 })

	// A broken replacement: the new certificate keeps serving. (The
	// rotation may have counted a failure already: a look between the
	// key's rename and the certificate's found a pair that does not match.)
	failuresBefore := metricValue(adminText(t, addrs.Admin, "/metrics"), `kvgate_tls_certificate_reloads_total{result="failure"}`)
	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the broken certificate to be counted", func() bool {
		return metricValue(adminText(t, addrs.Admin, "/metrics"), `kvgate_tls_certificate_reloads_total{result="failure"}`) == failuresBefore+1
	})
	before = ok.Load()
	waittest.Until(t, 10*time.Second, "traffic after the broken replacement", func() bool { return ok.Load() >= before+20 })
	close(stop)
	wg.Wait()
	failures.Range(func(k, v any) bool {
		t.Errorf("%s: %s", v, k)
		return true
	})
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the rotation", failed.Load(), failed.Load()+ok.Load())
	}
	for _, w := range workers[:2] {
		if n := w.dials.Load(); n != 1 {
			t.Errorf("%s: %d connections, want its first kept across the rotation", w.name, n)
		}
	}
	c, err := tls.Dial("tcp", addrs.API, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber.String(); got != second.Serial.String() {
		t.Fatalf("serving serial %s after the broken replacement, want %s", got, second.Serial)
	}
	metrics := adminText(t, addrs.Admin, "/metrics")
	if want := fmt.Sprintf("kvgate_tls_certificate_expiry_timestamp_seconds %g", float64(second.NotAfter.Unix())); !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %q", want)
	}
	t.Logf("%d requests, none failed; metrics:\n%s", ok.Load(), grepLines(metrics, "kvgate_tls_"))
}

// metricValue is the value of a sample in a Prometheus text page (-1 when
// absent).
func metricValue(page, sample string) float64 {
	for _, l := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestTLSByReload: a configuration reload turns TLS on and off for new
// connections; files that do not load refuse the configuration (at start,
// Run fails; on reload, the previous one keeps serving).
func TestTLSByReload(t *testing.T) {
	a := startSim(t, llama, simserver.Options{}).Addr()
	ca := certstest.NewCA(t, "ca")
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t).Write(t, dir)
	path := filepath.Join(dir, "igwc.yaml")

	t.Run("unloadable files at start", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.yaml")
		simtest.WriteFile(t, bad, []byte(configYAML(2, a)+tlsBlock(filepath.Join(dir, "none.crt"), keyFile)))
		err := servetest.Run(context.Background(), fromFile(bad), gateway.Options{})
		if err == nil || !strings.Contains(err.Error(), "spec.tls") {
			t.Fatalf("Run: %v, want the certificate's error", err)
		}
	})

	simtest.WriteFile(t, path, []byte(configYAML(2, a)))
	hup := make(chan os.Signal, 1)
	addrs := serveFile(t, path, hup).Addrs
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certstest.Pool(ca)}, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	plainClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	// served says how a new connection is answered: "https", "http" (plain)
	// or the plain request's 400.
	served := func() string {
		if resp, err := tlsClient.Get("https://" + addrs.API + "/v1/models"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return "https"
			}
		}
		resp, err := plainClient.Get("http://" + addrs.API + "/v1/models")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == 400 && resp.Header.Get("Content-Type") == "application/json" && strings.Contains(string(body), "HTTPS") {
			return "400 to plain HTTP"
		}
		return fmt.Sprintf("http %d", resp.StatusCode)
	}
	for _, step := range []struct {
		name, tls, want string
		accepted        bool
		only13          bool // a TLS 1.2 client is refused
	}{
		{"plain", "", "http 200", true, false},
		{"TLS on", tlsBlock(certFile, keyFile), "https", true, false},
		{"unloadable files", tlsBlock(filepath.Join(dir, "none.crt"), keyFile), "https", false, false},
		{"TLS 1.3 only", strings.Replace(tlsBlock(certFile, keyFile), "}", ", minVersion: \"1.3\"}", 1), "https", true, true},
		{"TLS off", "", "http 200", true, false},
	} {
		t.Run(step.name, func(t *testing.T) {
			before := readDebugConfig(t, addrs.Admin).When
			simtest.WriteFile(t, path, []byte(configYAML(2, a)+step.tls))
			hup <- os.Interrupt
			waittest.Until(t, 5*time.Second, "the reload", func() bool { return readDebugConfig(t, addrs.Admin).When != before })
			d := readDebugConfig(t, addrs.Admin)
			if d.Accepted != step.accepted {
				t.Fatalf("accepted %t (%s), want %t", d.Accepted, d.Error, step.accepted)
			}
			if got := served(); got != step.want {
				t.Fatalf("a new connection: %s, want %s", got, step.want)
			}
			if step.want == "https" {
				if got := served(); got != "https" {
					t.Fatal(got)
				}
				resp, err := plainClient.Get("http://" + addrs.API + "/v1/models")
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != 400 {
					t.Fatalf("plain HTTP to the TLS listener: %d", resp.StatusCode)
				}
				c, err := tls.Dial("tcp", addrs.API, &tls.Config{RootCAs: certstest.Pool(ca), MaxVersion: tls.VersionTLS12})
				if err == nil {
					_ = c.Close()
				}
				if (err != nil) != step.only13 {
					t.Fatalf("a TLS 1.2 client: %v, want refused %t", err, step.only13)
				}
			}
		})
	}
}
