package simserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Scheme is the server's URL scheme: https with Options.TLS, else http.
func (s *Server) Scheme() string {
	if s.opts.TLS != nil {
		return "https"
	}
	return "http"
}

// certRecheck is how often, at most, CertFiles reads its files again.
const certRecheck = time.Second

// CertFiles is a server TLS configuration whose certificate and key come from
// PEM files, read again (at most every second, as handshakes come) when they
// change, so that a re-issued certificate is served without a restart. Files
// that no longer load keep the last good pair.
func CertFiles(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("TLS needs both a certificate file and a key file")
	}
	c := &certFiles{certFile: certFile, keyFile: keyFile}
	cert, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cert, c.checked = cert, time.Now()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.get}, nil
}

type certFiles struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	checked time.Time
}

func (c *certFiles) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	return &cert, nil
}

func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < certRecheck {
		return c.cert, nil
	}
	c.checked = time.Now()
	// A pair caught half-written fails to load; the last good one serves.
	if cert, err := c.load(); err == nil {
		c.cert = cert
	}
	return c.cert, nil
}
