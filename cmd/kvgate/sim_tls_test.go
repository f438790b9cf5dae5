package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestSimTLSFlags: kvgate sim --tls-cert/--tls-key serves HTTPS with the
// certificate; a flag without the other or files that do not load are
// refused, naming the flags.
func TestSimTLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := simtest.NewCA(t, "sim")
	certPEM, keyPEM := ca.IssuePEM(t, "127.0.0.1")
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	simtest.WriteFile(t, cert, certPEM)
	simtest.WriteFile(t, key, keyPEM)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"certificate without key", []string{"--tls-cert", cert}},
		{"key without certificate", []string{"--tls-key", key}},
		{"missing files", []string{"--tls-cert", filepath.Join(dir, "none.crt"), "--tls-key", filepath.Join(dir, "none.key")}},
		{"key and certificate swapped", []string{"--tls-cert", key, "--tls-key", cert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, append([]string{"sim", "--listen", "127.0.0.1:0"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), "--tls-cert, --tls-key") {
				t.Fatalf("want a refusal naming the flags, got %v", err)
			}
		})
	}

	t.Run("serves HTTPS", func(t *testing.T) {
		root := newRoot()
		var out logtest.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"sim", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--log-level", "error"})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("kvgate sim: %v", err)
			}
		}()
		serving := regexp.MustCompile(`serving on (https://127\.0\.0\.1:\d+)`)
		waittest.Until(t, 10*time.Second, "the serving line", func() bool { return serving.MatchString(out.String()) })
		base := serving.FindStringSubmatch(out.String())[1]
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := c.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /v1/models over HTTPS: %s", resp.Status)
		}
	})
}
