package fleet

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// scrapeConn fetches one endpoint's /metrics over a kept-alive HTTP/1.1
// connection, request and response on the scraper's own goroutine. net/http's
// Transport hands every request to a writer and a reader goroutine; at 20 scrapes
// a second per endpoint those hand-offs were a fifth of the fleet's CPU
// (BenchmarkScrape256). Response parsing stays the standard library's
// (http.ReadResponse: status, headers, chunked bodies).
type scrapeConn struct {
	addr string
	req  []byte

	mu     sync.Mutex // guards c against the stop callback
	c      net.Conn
	br     *bufio.Reader
	closed bool
	// tls is what c was dialed with (nil: plain TCP); a scrape asking for
	// another dials anew. Only the scraper's goroutine uses it.
	tls ClientTLS
}

func newScrapeConn(addr string) *scrapeConn {
	return &scrapeConn{addr: addr,
		req: fmt.Appendf(nil, "GET /metrics HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvgate\r\nAccept: text/plain\r\n\r\n", addr)}
}

// close ends the connection for good; a scrape in progress fails at once.
func (s *scrapeConn) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.c != nil {
		_ = s.c.Close()
	}
}

// get reads the exposition into dst, within timeout, over TLS when tc is set.
func (s *scrapeConn) get(timeout time.Duration, dst *bytes.Buffer, tc ClientTLS) error {
	deadline := time.Now().Add(timeout)
	if tc != s.tls {
		s.mu.Lock()
		c := s.c
		s.mu.Unlock()
		if c != nil {
			s.drop(c)
		}
		s.tls = tc
	}
	c, err := s.conn(deadline)
	if err != nil {
		if answered(err) {
			return err
		}
		return unreachable{err}
	}
	if err := s.roundTrip(c, deadline, dst); err != nil {
		s.drop(c)
		return err
	}
	return nil
}

func (s *scrapeConn) conn(deadline time.Time) (net.Conn, error) {
	s.mu.Lock()
	c, closed := s.c, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errors.New("scraper stopped")
	}
	if c != nil {
		return c, nil
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", s.addr)
	if err != nil {
		return nil, err
	}
	if s.tls != nil {
		if c, err = s.handshake(c, deadline); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, errors.New("scraper stopped")
	}
	s.c = c
	if s.br == nil {
		s.br = bufio.NewReaderSize(c, 64<<10)
	} else {
		s.br.Reset(c)
	}
	return c, nil
}

// handshake secures raw with the scrape's TLS, offering HTTP/1.1 only (the
// scrape speaks nothing else). raw is held as the connection meanwhile, so
// that a stop aborts the handshake.
func (s *scrapeConn) handshake(raw net.Conn, deadline time.Time) (net.Conn, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = raw.Close()
		return nil, errors.New("scraper stopped")
	}
	s.c = raw
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.c == raw {
			s.c = nil
		}
		s.mu.Unlock()
	}()
	cfg := s.tls.ClientConfig(s.addr)
	cfg.NextProtos = []string{"http/1.1"}
	c := tls.Client(raw, cfg)
	if err := raw.SetDeadline(deadline); err != nil {
		_ = raw.Close()
		return nil, err
	}
	if err := c.Handshake(); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("TLS handshake (server name %q): %w", cfg.ServerName, err)
	}
	return c, nil
}

// answered says whether a failed handshake got an answer from the endpoint:
// a certificate refused, an alert, or something that is not TLS (a plain
// HTTP server). The process is up, unlike one that never answered.
func answered(err error) bool {
	var (
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		record tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &record)
}

func (s *scrapeConn) roundTrip(c net.Conn, deadline time.Time, dst *bytes.Buffer) error {
	if err := c.SetDeadline(deadline); err != nil {
		return unreachable{err}
	}
	if _, err := c.Write(s.req); err != nil {
		return unreachable{err}
	}
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		return unreachable{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("metrics answered %s", resp.Status)
	}
	// A model server's exposition is tens of kilobytes; more is not a model server.
	n, err := dst.ReadFrom(io.LimitReader(resp.Body, maxExposition+1))
	if err != nil {
		return fmt.Errorf("reading metrics: %w", err)
	}
	if n > maxExposition {
		return fmt.Errorf("metrics exceed %d bytes", maxExposition)
	}
	if resp.Close {
		s.drop(c)
	}
	return nil
}

// drop closes c if it is still the connection in use; the next scrape dials.
func (s *scrapeConn) drop(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	if s.c == c {
		s.c = nil
	}
	s.mu.Unlock()
}

// unreachable is a scrape that got no answer at all (refused, reset, timed
// out): the process is gone or frozen, unlike one whose /metrics answers an
// error while it may still serve.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }
func (u unreachable) Unwrap() error { return u.err }

// IsUnreachable reports whether a scrape's error is one that got no answer.
func IsUnreachable(err error) bool { return errors.As(err, new(unreachable)) }
