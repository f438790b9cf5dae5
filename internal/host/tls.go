package host

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/certs"
)

// listenerTLS is the API listener's TLS as the configuration's spec.tls says
// (kvgate serve): none, a certificate from files, or one from a Secret that
// the Kubernetes source hands over (SetCertificate). Each new connection asks
// for the configuration of now, so that a configuration arriving after the
// listener is bound, or a reload, turns TLS on or off.
type listenerTLS struct {
	log     *slog.Logger
	metrics *certs.Metrics

	mu     sync.Mutex
	files  *certs.Files // certFile and keyFile, when so configured
	secret string       // spec.tls.secretName, when so configured
	store  *certs.Store // the Secret's certificate
	cfg    atomic.Pointer[tls.Config]
}

// serveTLS makes the host serve spec.tls on its API listener; without it
// (kvgate epp, whose gRPC listener has its own flags) spec.tls is ignored.
func (h *Host) serveTLS() {
	h.tls = &listenerTLS{log: h.log, metrics: certs.NewMetrics(h.Metrics().Registry)}
}

// TLSConfig is the API listener's TLS configuration now, nil for plain HTTP.
func (h *Host) TLSConfig() *tls.Config {
	if h.tls == nil {
		return nil
	}
	return h.tls.cfg.Load()
}

// awaitingCertificate says why the API listener refuses every handshake
// (spec.tls names a Secret whose certificate has not loaded), "" when it
// does not: a replica that cannot serve is not ready.
func (h *Host) awaitingCertificate() string {
	if h.tls == nil {
		return ""
	}
	t := h.tls
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.secret == "" || t.store.Certificate() != nil {
		return ""
	}
	return fmt.Sprintf("no TLS certificate: Secret %q (spec.tls.secretName) has not loaded; TLS handshakes are refused", t.secret)
}

// ServesTLS says whether the gateway serves spec.tls (kvgate serve).
func (h *Host) ServesTLS() bool { return h.tls != nil }

// SetCertificate installs the certificate of the Secret spec.tls names
// (tls.crt and tls.key). One that does not load, or a Secret the
// configuration does not name, changes nothing.
func (h *Host) SetCertificate(secret string, certPEM, keyPEM []byte) error {
	if h.tls == nil {
		return nil
	}
	t := h.tls
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.secret == "" || secret != t.secret {
		return fmt.Errorf("secret %q is not the one spec.tls names", secret)
	}
	old := t.store.Certificate()
	if err := t.store.SetPEM(certPEM, keyPEM); err != nil {
		if old != nil {
			return fmt.Errorf("%w (the previous certificate keeps serving)", err)
		}
		return err
	}
	c := t.store.Certificate()
	attrs := []any{"secret", secret, "serial", c.Leaf.SerialNumber.String(), "notAfter", c.Leaf.NotAfter}
	if old != nil {
		attrs = append(attrs, "previousSerial", old.Leaf.SerialNumber.String())
	}
	t.log.Info("TLS certificate loaded", attrs...)
	return nil
}

// prepareTLS reads what a configuration's spec.tls needs (certificate files
// load now: a configuration whose files do not is refused) and returns what
// installs it once the rest of the configuration is accepted.
func (h *Host) prepareTLS(cfg *v1alpha1.InferenceGatewayConfig) (func(), error) {
	t := h.tls
	spec := cfg.Spec.TLS
	if t == nil {
		return func() {}, nil
	}
	t.mu.Lock()
	files, secret, store := t.files, t.secret, t.store
	t.mu.Unlock()
	var get func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	switch {
	case spec == nil:
		files, secret, store = nil, "", nil
	case spec.CertFile != "":
		if files == nil || files.CertFile != spec.CertFile || files.KeyFile != spec.KeyFile {
			files = &certs.Files{CertFile: spec.CertFile, KeyFile: spec.KeyFile, Log: t.log, Metrics: t.metrics}
			if err := files.Load(); err != nil {
				return nil, fmt.Errorf("spec.tls: %w", err)
			}
		}
		secret, store, get = "", nil, files.GetCertificate
	default:
		// Until the Secret's certificate arrives, handshakes are refused:
		// the listener never falls back to plain HTTP.
		if store == nil || secret != spec.SecretName {
			store = &certs.Store{Metrics: t.metrics}
		}
		files, secret, get = nil, spec.SecretName, store.GetCertificate
	}
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if spec == nil || (files == nil && store.Certificate() == nil) {
			t.metrics.Clear()
		}
		t.files, t.secret, t.store = files, secret, store
		if spec == nil {
			t.cfg.Store(nil)
			return
		}
		min := uint16(tls.VersionTLS12)
		if spec.MinVersion == "1.3" {
			min = tls.VersionTLS13
		}
		t.cfg.Store(&tls.Config{GetCertificate: get, MinVersion: min, NextProtos: []string{"h2", "http/1.1"}})
	}, nil
}
