package extproc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"path/filepath"
	"time"

	"github.com/kvgate/kvgate/internal/certs"
)

// TLSConfig is ServingTLS without metrics, logging to slog's default.
func TLSConfig(dir string) (*tls.Config, error) { return ServingTLS(dir, nil, nil) }

// ServingTLS returns the ext_proc listener's TLS: the certificate and key in dir
// (tls.crt, tls.key, as a Kubernetes TLS Secret mounts them), read again when
// they change (new connections get a rotated certificate; one that does not
// load is logged and counted in m, and the previous keeps serving), or, with
// dir empty, a self-signed certificate made at startup. Gateways that dial the
// picker over TLS without verifying it (Envoy AI Gateway, GIE's Istio setup)
// need only the latter, as GIE's own picker serves by default. log and m may
// be nil.
func ServingTLS(dir string, log *slog.Logger, m *certs.Metrics) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if dir == "" {
		cert, err := selfSigned()
		if err != nil {
			return nil, fmt.Errorf("TLS certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		return cfg, nil
	}
	f := &certs.Files{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), Log: log, Metrics: m}
	if err := f.Load(); err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg.GetCertificate = f.GetCertificate
	return cfg, nil
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"kvgate"}, CommonName: "kvgate-epp"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kvgate-epp"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
