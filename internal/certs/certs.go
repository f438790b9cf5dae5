// Package certs holds a TLS listener's certificate and replaces it when it is
// rotated: from PEM files, reread when they change, or from PEM handed over
// (a Kubernetes Secret). Handshakes take the current certificate through
// GetCertificate, so a rotation reaches new connections and leaves the open
// ones alone; a replacement that does not load keeps the previous one.
package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrNoCertificate is a handshake's error while no certificate has loaded.
var ErrNoCertificate = errors.New("no TLS certificate loaded")

// Metrics count a listener's certificate loads and export the current
// certificate's expiry. One Metrics serves one listener.
type Metrics struct {
	reloads *prometheus.CounterVec
	expiry  *prometheus.Desc
	// notAfter is the current certificate's expiry (Unix seconds), 0 with none.
	notAfter atomic.Int64
}

// NewMetrics creates the certificate metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tls_certificate_reloads_total",
			Help: "Loads of the listener's TLS certificate (the first and each rotation) by result: success, or failure (unreadable, unparsable, key not matching; the previous certificate keeps serving).",
		}, []string{"result"}),
		expiry: prometheus.NewDesc("kvgate_tls_certificate_expiry_timestamp_seconds",
			"When the listener's current TLS certificate expires (its NotAfter, Unix seconds); absent while none is loaded.", nil, nil),
	}
	for _, r := range []string{"success", "failure"} {
		m.reloads.WithLabelValues(r)
	}
	reg.MustRegister(m.reloads, m)
	return m
}

// Describe implements prometheus.Collector for the expiry gauge.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.expiry }

// Collect implements prometheus.Collector for the expiry gauge.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if t := m.notAfter.Load(); t != 0 {
		ch <- prometheus.MustNewConstMetric(m.expiry, prometheus.GaugeValue, float64(t))
	}
}

func (m *Metrics) loaded(c *tls.Certificate, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.reloads.WithLabelValues("failure").Inc()
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.notAfter.Store(c.Leaf.NotAfter.Unix())
}

// Clear removes the expiry gauge: the listener serves no certificate.
func (m *Metrics) Clear() {
	if m != nil {
		m.notAfter.Store(0)
	}
}

// Parse loads a PEM certificate chain and its key, checking that they match.
func Parse(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// Store is a certificate set from outside (SetPEM), kept until a valid one
// replaces it. The zero Store has none.
type Store struct {
	// Metrics, when set, count the loads.
	Metrics *Metrics
	cur     atomic.Pointer[tls.Certificate]
}

// SetPEM replaces the certificate with certPEM and keyPEM, or, when they do
// not load, keeps the current one and says why.
func (s *Store) SetPEM(certPEM, keyPEM []byte) error {
	c, err := Parse(certPEM, keyPEM)
	s.Metrics.loaded(c, err)
	if err != nil {
		return err
	}
	s.cur.Store(c)
	return nil
}

// Certificate is the current certificate, nil before the first.
func (s *Store) Certificate() *tls.Certificate { return s.cur.Load() }

// GetCertificate is tls.Config.GetCertificate.
func (s *Store) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cur.Load(); c != nil {
		return c, nil
	}
	return nil, ErrNoCertificate
}

// DefaultInterval is how often Files looks at its files again.
const DefaultInterval = time.Second

// Files is a certificate read from PEM files and read again, at most every
// Interval, when a handshake or Check finds them changed. Reading on demand
// rather than on file events sees every way of replacing them: written in
// place, renamed over, or a Kubernetes volume's symlink swap.
type Files struct {
	CertFile, KeyFile string
	// Interval between looks at the files (default DefaultInterval).
	Interval time.Duration
	Log      *slog.Logger
	Metrics  *Metrics

	store Store
	mu    sync.Mutex // one reader at a time; handshakes meanwhile take the current certificate
	next  time.Time  // the next look at the files
	// seen are the contents last read, loaded or not, so that a bad pair
	// is logged once rather than at every look.
	seenCert, seenKey []byte
	lastErr           string // the last problem logged
}

// Load reads the files now: the first load, whose error is the caller's
// (a configuration naming files that do not load is refused).
func (f *Files) Load() error {
	f.store.Metrics = f.Metrics
	f.mu.Lock()
	defer f.mu.Unlock()
	changed, err := f.read()
	if err == nil && !changed && f.store.Certificate() == nil {
		err = errors.New("no certificate")
	}
	return err
}

// read loads the files when their contents differ from the last seen.
func (f *Files) read() (bool, error) {
	f.next = time.Now().Add(f.interval())
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return false, fmt.Errorf("certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return false, fmt.Errorf("key: %w", err)
	}
	if bytes.Equal(certPEM, f.seenCert) && bytes.Equal(keyPEM, f.seenKey) {
		return false, nil
	}
	f.seenCert, f.seenKey = certPEM, keyPEM
	if err := f.store.SetPEM(certPEM, keyPEM); err != nil {
		return true, fmt.Errorf("%s and %s: %w", f.CertFile, f.KeyFile, err)
	}
	return true, nil
}

func (f *Files) interval() time.Duration {
	if f.Interval > 0 {
		return f.Interval
	}
	return DefaultInterval
}

// Check reads the files again if Interval has passed since the last look.
func (f *Files) Check() {
	if !f.mu.TryLock() {
		return // another handshake is reading them
	}
	defer f.mu.Unlock()
	if time.Now().Before(f.next) {
		return
	}
	old := f.store.Certificate()
	changed, err := f.read()
	log := f.Log
	if log == nil {
		log = slog.Default()
	}
	if err == nil {
		f.lastErr = ""
	}
	switch {
	case err != nil:
		// Logged once per distinct problem, not at every look.
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			if !changed {
				f.Metrics.loaded(nil, err) // unreadable; a bad pair was counted by SetPEM
			}
			log.Error("TLS certificate not reloaded; the previous one keeps serving", "err", err)
		}
	case changed:
		c := f.store.Certificate()
		attrs := []any{"cert", f.CertFile, "serial", c.Leaf.SerialNumber.String(), "notAfter", c.Leaf.NotAfter}
		if old != nil {
			attrs = append(attrs, "previousSerial", old.Leaf.SerialNumber.String())
		}
		log.Info("TLS certificate reloaded", attrs...)
	}
}

// Certificate is the current certificate, nil before Load.
func (f *Files) Certificate() *tls.Certificate { return f.store.Certificate() }

// GetCertificate is tls.Config.GetCertificate.
func (f *Files) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.Check()
	return f.store.GetCertificate(hello)
}
