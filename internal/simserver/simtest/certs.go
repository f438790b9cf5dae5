package simtest

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/internal/certs/certstest"
)

// CA is a certificate authority made for one test, to sign the certificates
// of simulated servers that serve TLS (certstest's, with its PEM at hand).
type CA struct {
	*certstest.CA
	// PEM is the CA certificate, as a bundle file holds it.
	PEM []byte
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := certstest.NewCA(t, name)
	return &CA{CA: ca, PEM: ca.PEM()}
}

// Issue signs a server certificate for names: DNS names, or IP addresses,
// which go in the IP SANs.
func (ca *CA) Issue(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.IssuePEM(t, names...)
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// IssuePEM is Issue as PEM certificate and key.
func (ca *CA) IssuePEM(t testing.TB, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	l := ca.IssueFor(t, names...)
	return l.CertPEM, l.KeyPEM
}

// WriteFile writes data to path by renaming a file written next to it, as a
// mounted ConfigMap or Secret changes: a reader never sees it half-written.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
