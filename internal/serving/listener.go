package serving

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// DefaultHandshakeTimeout bounds a client's TLS handshake.
const DefaultHandshakeTimeout = 10 * time.Second

// UnsentLimit is how many answer bytes a connection may queue in the kernel
// beyond what is sent: a few segments, enough to keep a reading client's link
// busy, little for a client that stopped reading to hide behind.
const UnsentLimit = 16 << 10

// Bounds of the answer to a connection that is closed after a protocol
// error: the client's unread bytes are read and dropped for a while, so that
// closing does not reset the connection before the client has read the error.
const (
	lingerTimeout = time.Second
	lingerBytes   = 8 << 20
)

// listener hands http.Server connections that are ready to serve: plain, or,
// while tlsConfig returns a configuration, TLS with the handshake done. The
// handshakes run one goroutine each, off the accept loop, so that a slow
// client delays no other.
type listener struct {
	net.Listener
	tlsConfig func() *tls.Config
	timeout   time.Duration
	log       *slog.Logger

	ready  chan net.Conn
	errc   chan error
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
}

func newListener(ln net.Listener, tlsConfig func() *tls.Config, timeout time.Duration, log *slog.Logger) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{Listener: ln, tlsConfig: tlsConfig, timeout: timeout, log: log,
		ready: make(chan net.Conn), errc: make(chan error), ctx: ctx, cancel: cancel}
	go l.accept()
	return l
}

// Accept returns the next connection ready to serve.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting and ends the handshakes under way.
func (l *listener) Close() error {
	l.cancel()
	return l.Listener.Close()
}

func (l *listener) accept() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			// http.Server backs off on a temporary error before its next
			// Accept, and that wait holds this loop too.
			select {
			case l.errc <- err:
			case <-l.ctx.Done():
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		limitUnsent(c)
		var cfg *tls.Config
		if l.tlsConfig != nil {
			cfg = l.tlsConfig()
		}
		if cfg == nil {
			l.hand(&conn{Conn: c})
			continue
		}
		go l.handshake(c, cfg)
	}
}

// hand gives c to http.Server, or closes it once the listener is closed.
func (l *listener) hand(c net.Conn) {
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		_ = c.Close()
	}
}

func (l *listener) handshake(raw net.Conn, cfg *tls.Config) {
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	tc := tls.Server(raw, cfg)
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		l.refuse(raw, err)
		return
	}
	_ = raw.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		// http.Server takes its HTTP/2 path for a *tls.Conn only; HTTP/2's
		// own errors are frames, not text.
		l.hand(tc)
		return
	}
	l.hand(&tlsConn{conn: conn{Conn: tc}, tls: tc})
}

// refuse ends a connection whose handshake failed. A client that spoke plain
// HTTP gets a 400 it can read, as net/http's own TLS server writes one.
func (l *listener) refuse(raw net.Conn, err error) {
	var re tls.RecordHeaderError
	if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
		_, _ = raw.Write(errorResponse("HTTP/1.0", http.StatusBadRequest, "this listener serves HTTPS: the client sent plain HTTP"))
		linger(raw)
		err = errors.New("client sent an HTTP request to an HTTPS server")
	}
	_ = raw.Close()
	l.log.Debug("TLS handshake failed", "remote", raw.RemoteAddr().String(), "err", err)
}

// looksLikeHTTP says whether a TLS record header is the start of an HTTP
// request line instead (a method and a space or path).
func looksLikeHTTP(hdr [5]byte) bool {
	for _, b := range hdr {
		if (b < 'A' || b > 'Z') && b != ' ' && b != '/' && b != '*' {
			return false
		}
	}
	return true
}

// linger half-closes c and reads what the client still sends, for a bounded
// while, so that the close that follows does not reset the connection under
// an answer the client has not read yet.
func linger(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.CopyN(io.Discard, c, lingerBytes)
}

// errorResponse is a whole HTTP response with an OpenAI error body, closing
// the connection.
func errorResponse(proto string, status int, msg string) []byte {
	body := openai.ErrorJSON(status, openai.TypeInvalidRequest, msg)
	return fmt.Appendf(nil, "%s %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		proto, status, http.StatusText(status), len(body), body)
}

// conn rewrites the answers net/http's server writes to a connection itself,
// before any handler runs (a header too large, a malformed request or
// framing), from text/plain to OpenAI JSON errors with the same status.
type conn struct {
	net.Conn
	// handling is set while a handler answers a request on the connection:
	// then every write is the handler's and passes through untouched.
	handling atomic.Bool
	// rewrote is set once an error was rewritten: the connection closes
	// after it, lingering.
	rewrote atomic.Bool
}

func (c *conn) protocolConn() *conn { return c }

// Write implements net.Conn.
func (c *conn) Write(p []byte) (int, error) {
	if !c.handling.Load() {
		if status, msg, ok := protocolError(p); ok {
			c.rewrote.Store(true)
			if _, err := c.Conn.Write(errorResponse("HTTP/1.1", status, msg)); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, as http.Server does after a 431.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close implements net.Conn.
func (c *conn) Close() error {
	if c.rewrote.Swap(false) {
		linger(c)
	}
	return c.Conn.Close()
}

// tlsConn is a TLS connection serving HTTP/1.1: http.Server sets Request.TLS
// from ConnectionState.
type tlsConn struct {
	conn
	tls *tls.Conn
}

// ConnectionState is the TLS connection's.
func (c *tlsConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// protocolConn finds the conn under a connection http.Server serves.
func protocolConn(c net.Conn) *conn {
	if pc, ok := c.(interface{ protocolConn() *conn }); ok {
		return pc.protocolConn()
	}
	return nil
}

// The shapes of net/http's own answers (net/http/server.go, conn.serve): one
// Write of a status line, these headers and a short text; and the 417 for an
// Expect header other than 100-continue, which has no body.
const (
	goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	goExpectFailed = "HTTP/1.1 417 Expectation Failed\r\n"
)

// protocolError recognises one of net/http's own error answers and returns
// its status and the message for the client.
func protocolError(p []byte) (int, string, bool) {
	if bytes.HasPrefix(p, []byte(goExpectFailed)) && bytes.HasSuffix(p, []byte("\r\nContent-Length: 0\r\n\r\n")) {
		return http.StatusExpectationFailed, "unsupported Expect header: only 100-continue is accepted", true
	}
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return 0, "", false
	}
	line, _, ok := bytes.Cut(rest, []byte(goErrorHeaders))
	if !ok || len(line) < 3 || bytes.Contains(line, []byte("\r\n")) {
		return 0, "", false
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil || status < 400 || status > 599 {
		return 0, "", false
	}
	msg := ""
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		msg = "the request's header fields are too large"
	case http.StatusNotImplemented:
		msg = "unsupported transfer encoding: only chunked is accepted"
	default:
		// A status with a reason (statusError: "400 Bad Request: missing
		// required Host header") says what was wrong; net/http writes these
		// to clients, they carry nothing of the server's.
		if _, detail, ok := bytes.Cut(line, []byte(": ")); ok {
			msg = "malformed HTTP request: " + string(detail)
		} else {
			msg = "malformed HTTP request: the request line, a header or the body's framing (Content-Length, Transfer-Encoding) is invalid"
		}
	}
	return status, msg, true
}
