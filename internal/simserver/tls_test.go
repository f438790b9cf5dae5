package simserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// trusting is an HTTP client that trusts ca only, offering protos by ALPN,
// with a fresh connection for every request.
func trusting(ca *simtest.CA, protos ...string) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	t := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, NextProtos: protos}, DisableKeepAlives: true, ForceAttemptHTTP2: len(protos) > 1}
	return &http.Client{Transport: t, Timeout: 10 * time.Second}
}

// TestServesTLS: with Options.TLS the server answers the OpenAI API and its
// metrics over HTTPS, h2 or HTTP/1.1 as ALPN chooses; a certificate file
// re-issued by another CA is served from the next handshakes on, without a
// restart; a plain-HTTP client gets no answer it could take for one.
func TestServesTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca := simtest.NewCA(t, "first")
	certPEM, keyPEM := ca.IssuePEM(t, "127.0.0.1")
	simtest.WriteFile(t, certFile, certPEM)
	simtest.WriteFile(t, keyFile, keyPEM)
	cfg, err := simserver.CertFiles(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s := simtest.Start(t, simserver.Options{TLS: cfg})
	if s.Scheme() != "https" {
		t.Fatalf("scheme %q", s.Scheme())
	}
	base := "https://" + s.Addr()

	for _, tc := range []struct {
		name   string
		protos []string
		major  int
	}{
		{"h2 by ALPN", []string{"h2", "http/1.1"}, 2},
		{"HTTP/1.1", []string{"http/1.1"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := trusting(ca, tc.protos...)
			var raw *http.Response
			c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
			resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello")}, MaxTokens: openai.Int(4),
			}, option.WithResponseInto(&raw))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Choices) != 1 || raw.ProtoMajor != tc.major {
				t.Errorf("choices %d over HTTP/%d; want 1 over HTTP/%d", len(resp.Choices), raw.ProtoMajor, tc.major)
			}
			m, err := hc.Get(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			_ = m.Body.Close()
			if m.StatusCode != http.StatusOK {
				t.Errorf("/metrics: %s", m.Status)
			}
		})
	}

	t.Run("plain HTTP client", func(t *testing.T) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + s.Addr() + "/v1/models")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("a plain-HTTP request was answered %s", resp.Status)
			}
		}
	})

	t.Run("certificate re-issued", func(t *testing.T) {
		next := simtest.NewCA(t, "second")
		certPEM, keyPEM := next.IssuePEM(t, "127.0.0.1")
		simtest.WriteFile(t, keyFile, keyPEM)
		simtest.WriteFile(t, certFile, certPEM)
		hc := trusting(next, "http/1.1")
		waittest.Until(t, 10*time.Second, "the new certificate served", func() bool {
			resp, err := hc.Get(base + "/v1/models")
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if resp, err := trusting(ca, "http/1.1").Get(base + "/v1/models"); err == nil {
			_ = resp.Body.Close()
			t.Errorf("the old certificate is still served: %s", resp.Status)
		}
	})
}

func TestCertFilesRefused(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	simtest.WriteFile(t, bad, []byte("not a certificate"))
	for _, tc := range []struct{ name, cert, key string }{
		{"no key", bad, ""},
		{"missing files", filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key")},
		{"not PEM", bad, bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := simserver.CertFiles(tc.cert, tc.key); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
