package serving

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/certs"
	"github.com/kvgate/kvgate/internal/certs/certstest"
	"github.com/kvgate/kvgate/internal/openai"
)

var quiet = slog.New(slog.DiscardHandler)

// server is an API serving a handler that says how it was reached.
type server struct {
	addr string
	tls  atomic.Pointer[tls.Config]
	api  *API
}

func startAPI(t *testing.T, tweak ...func(*API)) *server {
	t.Helper()
	s := &server{}
	s.api = NewAPI(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = fmt.Fprintf(w, "proto=%s tls=%t", r.Proto, r.TLS != nil)
	}), quiet)
	s.api.TLS = s.tls.Load
	for _, f := range tweak {
		f(s.api)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- s.api.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.api.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// tlsFixture is a CA and a server configuration with a certificate it signed.
type tlsFixture struct {
	ca    *certstest.CA
	store *certs.Store
	cfg   *tls.Config
}

func newTLS(t *testing.T) *tlsFixture {
	t.Helper()
	ca := certstest.NewCA(t, "test CA")
	leaf := ca.Issue(t)
	store := &certs.Store{}
	if err := store.SetPEM(leaf.CertPEM, leaf.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return &tlsFixture{ca: ca, store: store,
		cfg: &tls.Config{GetCertificate: store.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}}
}

func (f *tlsFixture) client(protos ...string) *tls.Config {
	return &tls.Config{RootCAs: certstest.Pool(f.ca), ServerName: "localhost", NextProtos: protos}
}

// readError reads one response and checks it is an OpenAI JSON error with
// the status.
func readError(t *testing.T, c net.Conn, status int) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %q", resp.StatusCode, status, raw)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json: %q", ct, raw)
	}
	var body openai.ErrorBody
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("not JSON: %q", raw)
	}
	if body.Error.Message == "" || body.Error.Type != openai.TypeInvalidRequest || body.Error.Code != float64(status) {
		t.Fatalf("not an OpenAI error with code %d: %q", status, raw)
	}
	if int64(len(raw)) != resp.ContentLength {
		t.Fatalf("Content-Length %d for %d bytes", resp.ContentLength, len(raw))
	}
	return body.Error.Message
}

// TestProtocolErrorsAreJSON: what net/http answers before any handler runs
// (and the handler's own header limit) is an OpenAI JSON error, over plain
// HTTP and over TLS, on a fresh connection or after a request served on it.
func TestProtocolErrorsAreJSON(t *testing.T) {
	fx := newTLS(t)
	s := startAPI(t)
	cases := []struct {
		name, request string
		status        int
		want          string // in the message
	}{
		{"header of 1 MB", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 1_000_000) + "\r\n\r\n", 431, "too large"},
		{"header of 2 MB, over net/http's limit", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2_000_000) + "\r\n\r\n", 431, "too large"},
		{"two different Content-Lengths", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, "malformed"},
		{"Transfer-Encoding chunked, identity", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 501, "transfer encoding"},
		{"no Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400, "Host"},
		{"Expect other than 100-continue", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", 417, "Expect"},
		{"not HTTP", "HELLO THERE\r\n\r\n", 400, "malformed"},
	}
	dials := []struct {
		name string
		dial func(t *testing.T) net.Conn
	}{
		{"plain", func(t *testing.T) net.Conn {
			s.tls.Store(nil)
			c, err := net.Dial("tcp", s.addr)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"TLS HTTP/1.1", func(t *testing.T) net.Conn {
			s.tls.Store(fx.cfg)
			c, err := tls.Dial("tcp", s.addr, fx.client("http/1.1"))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	}
	for _, d := range dials {
		for _, after := range []bool{false, true} {
			for _, tc := range cases {
				name := d.name + "/" + tc.name
				if after {
					name = d.name + "/after a request/" + tc.name
				}
				t.Run(name, func(t *testing.T) {
					c := d.dial(t)
					defer c.Close()
					if after {
						// A request answered first: writes are net/http's own
						// again once the connection is idle.
						if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
							t.Fatal(err)
						}
						br := bufio.NewReader(c)
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							t.Fatal(err)
						}
						body, _ := io.ReadAll(resp.Body)
						if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "proto=HTTP/1.1") {
							t.Fatalf("first request: %d %q", resp.StatusCode, body)
						}
						if br.Buffered() != 0 {
							t.Fatal("bytes after the first response")
						}
					}
					// The client writes while the server may stop reading.
					go func() { _, _ = io.WriteString(c, tc.request) }()
					if msg := readError(t, c, tc.status); !strings.Contains(msg, tc.want) {
						t.Fatalf("message %q does not say %q", msg, tc.want)
					}
				})
			}
		}
	}
}

// TestHandlerResponsesUntouched: what a handler writes passes through as
// written, even bytes shaped exactly like net/http's own errors.
func TestHandlerResponsesUntouched(t *testing.T) {
	api := NewAPI(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request"+goErrorHeaders+"400 Bad Request")
	}), quiet)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve(ln) }()
	defer func() { _ = api.Close() }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || string(body) != "400 Bad Request" || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("the handler's answer was changed: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// TestTLSListener: h2 and HTTP/1.1 by ALPN with Request.TLS set, versions
// below the minimum refused, plain HTTP answered 400 in JSON, and TLS turned
// on for new connections while an open plain one goes on.
func TestTLSListener(t *testing.T) {
	fx := newTLS(t)
	s := startAPI(t)
	get := func(t *testing.T, tr *http.Transport) (string, error) {
		t.Helper()
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + s.addr + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.Proto + " " + string(body), err
	}
	s.tls.Store(fx.cfg)
	for _, tc := range []struct {
		name string
		tr   *http.Transport
		want string
	}{
		{"h2", &http.Transport{TLSClientConfig: fx.client(), ForceAttemptHTTP2: true}, "HTTP/2.0 proto=HTTP/2.0 tls=true"},
		{"http/1.1", &http.Transport{TLSClientConfig: fx.client("http/1.1")}, "HTTP/1.1 proto=HTTP/1.1 tls=true"},
		{"no ALPN", &http.Transport{TLSClientConfig: fx.client(), TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}, "HTTP/1.1 proto=HTTP/1.1 tls=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := get(t, tc.tr)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("h2 header over the limit", func(t *testing.T) {
		tr := &http.Transport{TLSClientConfig: fx.client(), ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/", nil)
		req.Header.Set("X-Big", strings.Repeat("a", 100_000))
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.Proto != "HTTP/2.0" || resp.StatusCode != 431 || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), "too large") {
			t.Fatalf("%s %d %q: %q", resp.Proto, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
	t.Run("versions", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			min, max uint16 // server minimum, client maximum
			ok       bool
		}{
			{"TLS 1.1 client, minimum 1.2", tls.VersionTLS12, tls.VersionTLS11, false},
			{"TLS 1.2 client, minimum 1.2", tls.VersionTLS12, tls.VersionTLS12, true},
			{"TLS 1.2 client, minimum 1.3", tls.VersionTLS13, tls.VersionTLS12, false},
			{"TLS 1.3 client, minimum 1.3", tls.VersionTLS13, tls.VersionTLS13, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := fx.cfg.Clone()
				cfg.MinVersion = tc.min
				s.tls.Store(cfg)
				defer s.tls.Store(fx.cfg)
				cc := fx.client("http/1.1")
				cc.MinVersion, cc.MaxVersion = tls.VersionTLS10, tc.max
				c, err := tls.Dial("tcp", s.addr, cc)
				if err == nil {
					_ = c.Close()
				}
				if (err == nil) != tc.ok {
					t.Fatalf("handshake error %v, want success %t", err, tc.ok)
				}
			})
		}
	})
	t.Run("plain HTTP to TLS", func(t *testing.T) {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		}()
		if msg := readError(t, c, 400); !strings.Contains(msg, "HTTPS") {
			t.Fatalf("message %q", msg)
		}
	})
	t.Run("turned on under an open connection", func(t *testing.T) {
		s.tls.Store(nil)
		plain := &http.Transport{}
		defer plain.CloseIdleConnections()
		client := &http.Client{Transport: plain, Timeout: 10 * time.Second}
		var conns atomic.Int32
		plain.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conns.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		for i := range 3 {
			if i == 1 {
				s.tls.Store(fx.cfg) // new connections are TLS from now on
			}
			resp, err := client.Get("http://" + s.addr + "/")
			if err != nil {
				t.Fatalf("request %d on the open plain connection: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if n := conns.Load(); n != 1 {
			t.Fatalf("%d connections, want the one kept open", n)
		}
		if got, err := get(t, &http.Transport{TLSClientConfig: fx.client()}); err != nil || !strings.Contains(got, "tls=true") {
			t.Fatalf("a new connection: %q, %v", got, err)
		}
	})
}

// TestHandshakeOffTheAcceptLoop: clients that connect and never finish a
// handshake delay nobody, and are dropped after HandshakeTimeout.
func TestHandshakeOffTheAcceptLoop(t *testing.T) {
	fx := newTLS(t)
	s := startAPI(t, func(a *API) { a.HandshakeTimeout = 500 * time.Millisecond })
	s.tls.Store(fx.cfg)
	var stalled []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stalled = append(stalled, c)
	}
	tr := &http.Transport{TLSClientConfig: fx.client()}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + s.addr + "/")
	if err != nil {
		t.Fatalf("a client behind 20 stalled handshakes: %v", err)
	}
	_ = resp.Body.Close()
	for i, c := range stalled {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("stalled connection %d: read %v, want EOF once the handshake timed out", i, err)
		}
	}
}

// TestNoCertificateRefusesTLS: while no certificate has loaded, handshakes
// fail; nothing is served in plain HTTP instead.
func TestNoCertificateRefusesTLS(t *testing.T) {
	fx := newTLS(t)
	s := startAPI(t)
	empty := &certs.Store{}
	cfg := fx.cfg.Clone()
	cfg.GetCertificate = empty.GetCertificate
	s.tls.Store(cfg)
	if c, err := tls.Dial("tcp", s.addr, fx.client()); err == nil {
		_ = c.Close()
		t.Fatal("a handshake succeeded with no certificate")
	}
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() { _, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") }()
	readError(t, c, 400)
}
