package certs

import (
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/certs/certstest"
	"github.com/kvgate/kvgate/internal/promtest"
)

func serialOf(t *testing.T, get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) string {
	t.Helper()
	c, err := get(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatalf("GetCertificate: %v", err)
	}
	return c.Leaf.SerialNumber.String()
}

// TestFiles: files are reread when they change; a replacement that does not
// load (garbage, a key of another certificate, files gone) keeps the
// certificate serving, and is counted.
func TestFiles(t *testing.T) {
	ca := certstest.NewCA(t, "ca")
	dir := t.TempDir()
	first := ca.Issue(t)
	certFile, keyFile := first.Write(t, dir)
	reg := prometheus.NewRegistry()
	// Interval 1 ns: every handshake looks at the files.
	f := &Files{CertFile: certFile, KeyFile: keyFile, Interval: 1, Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg)}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	want := first.Serial.String()
	expiry := first.NotAfter
	for _, step := range []struct {
		name    string
		change  func()
		loads   bool
		failure float64 // failures counted so far
	}{
		{"unchanged", func() {}, false, 0},
		{"rotated", func() { l := ca.Issue(t); l.Write(t, dir); want, expiry = l.Serial.String(), l.NotAfter }, true, 0},
		{"garbage certificate", func() {
			if err := os.WriteFile(certFile, []byte("not PEM"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, false, 1},
		{"a key of another certificate", func() {
			a, b := ca.Issue(t), ca.Issue(t)
			a.Write(t, dir)
			if err := os.WriteFile(keyFile, b.KeyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		}, false, 2},
		{"files gone", func() {
			if err := os.Remove(certFile); err != nil {
				t.Fatal(err)
			}
		}, false, 3},
		{"back", func() { l := ca.Issue(t); l.Write(t, dir); want, expiry = l.Serial.String(), l.NotAfter }, true, 3},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.change()
			if got := serialOf(t, f.GetCertificate); got != want {
				t.Fatalf("serving serial %s, want %s", got, want)
			}
			if got := promtest.Value(t, reg, "kvgate_tls_certificate_reloads_total", "result", "failure"); got != step.failure {
				t.Fatalf("%v failures counted, want %v", got, step.failure)
			}
			if got := promtest.Value(t, reg, "kvgate_tls_certificate_expiry_timestamp_seconds"); got != float64(expiry.Unix()) {
				t.Fatalf("expiry %v, want %v", got, expiry.Unix())
			}
		})
	}
}

func TestFilesFirstLoad(t *testing.T) {
	ca := certstest.NewCA(t, "ca")
	dir := t.TempDir()
	leaf := ca.Issue(t)
	certFile, keyFile := leaf.Write(t, dir)
	other := ca.Issue(t)
	mismatched := filepath.Join(dir, "other.key")
	if err := os.WriteFile(mismatched, other.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, cert, key string
		ok              bool
	}{
		{"good", certFile, keyFile, true},
		{"no such certificate", filepath.Join(dir, "none.crt"), keyFile, false},
		{"no such key", certFile, filepath.Join(dir, "none.key"), false},
		{"key of another certificate", certFile, mismatched, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Files{CertFile: tc.cert, KeyFile: tc.key}
			if err := f.Load(); (err == nil) != tc.ok {
				t.Fatalf("Load: %v, want success %t", err, tc.ok)
			}
			if _, err := f.GetCertificate(&tls.ClientHelloInfo{}); (err == nil) != tc.ok {
				t.Fatalf("GetCertificate: %v, want success %t", err, tc.ok)
			}
		})
	}
}

func TestStore(t *testing.T) {
	ca := certstest.NewCA(t, "ca")
	s := &Store{}
	if _, err := s.GetCertificate(nil); err == nil {
		t.Fatal("an empty store served a certificate")
	}
	a, b := ca.Issue(t), ca.Issue(t)
	if err := s.SetPEM(a.CertPEM, a.KeyPEM); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2][]byte{{[]byte("x"), a.KeyPEM}, {a.CertPEM, b.KeyPEM}, {nil, nil}} {
		if err := s.SetPEM(bad[0], bad[1]); err == nil {
			t.Fatal("a bad pair loaded")
		}
	}
	if got := serialOf(t, s.GetCertificate); got != a.Serial.String() {
		t.Fatalf("serving %s after bad pairs, want %s", got, a.Serial)
	}
}
