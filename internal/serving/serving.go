// Package serving runs kvgate's two listeners — a data plane (the OpenAI API,
// or the ext_proc gRPC server) and the admin HTTP server — and drains them on
// stop; `kvgate serve`, `epp` and `global` share it.
package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
)

// Server is a data plane served on a listener until Shutdown; Serve returns nil
// or http.ErrServerClosed once shut down.
type Server interface {
	Serve(ln net.Listener) error
	Shutdown(ctx context.Context) error
}

// Listen binds the API and admin addresses, both or neither.
func Listen(api, admin string) (net.Listener, net.Listener, error) {
	apiLn, err := net.Listen("tcp", api)
	if err != nil {
		return nil, nil, fmt.Errorf("API listener: %w", err)
	}
	adminLn, err := net.Listen("tcp", admin)
	if err != nil {
		_ = apiLn.Close()
		return nil, nil, fmt.Errorf("admin listener: %w", err)
	}
	return apiLn, adminLn, nil
}

// API is the HTTP server of an OpenAI API: bounded headers and idle
// connections, and net/http's own complaints (bad requests) at debug level.
// Once Closing, each response asks its client to reconnect (Connection:
// close), so that keep-alive connections end between requests rather than
// under one; Abort ends the requests still running with proxy.ErrShutdown.
// The errors net/http answers itself (a malformed request, its framing, a
// header over MaxHeaderBytes) are OpenAI JSON errors like the handler's.
type API struct {
	*http.Server
	// TLS, when set, is asked for every new connection: a configuration
	// makes it TLS (HTTP/2 or HTTP/1.1 by ALPN, as NextProtos offer), nil
	// plain HTTP. A plain HTTP request on a TLS connection gets a 400.
	TLS func() *tls.Config
	// HandshakeTimeout bounds a TLS handshake (default
	// DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	closing          atomic.Bool
	abort            context.CancelCauseFunc
	log              *slog.Logger
}

// Header limits: a request whose header is over HeaderLimit is answered 431
// by the handler, having been read whole; net/http reads headers up to
// MaxHeaderBytes (Go's default), beyond which it answers 431 itself.
const (
	HeaderLimit    = 64 << 10
	MaxHeaderBytes = 1 << 20
)

type connKey struct{}

// NewAPI serves h.
func NewAPI(h http.Handler, log *slog.Logger) *API {
	base, abort := context.WithCancelCause(context.Background())
	a := &API{abort: abort, log: log}
	a.Server = &http.Server{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext: func(net.Listener) context.Context { return base },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if pc := protocolConn(c); pc != nil {
				return context.WithValue(ctx, connKey{}, pc)
			}
			return ctx
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			// Between requests, writes are net/http's own again.
			if pc := protocolConn(c); pc != nil && st == http.StateIdle {
				pc.handling.Store(false)
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if pc, ok := r.Context().Value(connKey{}).(*conn); ok {
				pc.handling.Store(true)
			}
			if a.closing.Load() {
				w.Header().Set("Connection", "close")
			}
			if n := headerBytes(r); n > HeaderLimit {
				// As net/http's own 431: a client that sends such headers
				// starts again on a new connection.
				w.Header().Set("Connection", "close")
				openai.WriteError(w, http.StatusRequestHeaderFieldsTooLarge, openai.TypeInvalidRequest,
					fmt.Sprintf("the request's header fields are too large: %d bytes, at most %d", n, HeaderLimit))
				return
			}
			h.ServeHTTP(w, r)
		})}
	return a
}

// Serve serves HTTP on ln, each connection TLS or plain as a.TLS says.
func (a *API) Serve(ln net.Listener) error {
	timeout := a.HandshakeTimeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	return a.Server.Serve(newListener(ln, a.TLS, timeout, a.log))
}

// headerBytes is about what the request's head took on the wire: the
// request line and each header field.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + len(r.Host) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// Closing makes every response from now on close its connection.
func (a *API) Closing() { a.closing.Store(true) }

// Abort ends every request still running, with cause.
func (a *API) Abort(cause error) { a.abort(cause) }

// Drain is how a server stops: PreStop is how long it keeps accepting, not
// ready, so that a load balancer still sending meets no refused connection;
// Timeout is how long requests in flight then have to finish, after which the
// ones still running are ended with an explicit error (proxy.ErrShutdown).
type Drain struct {
	PreStop, Timeout time.Duration
}

// abortGrace is how long requests ended at the drain's end have to write
// their error before their connections close.
const abortGrace = 2 * time.Second

// Serve runs api on apiLn and admin on adminLn until ctx ends, either fails, or
// a value arrives on errc (a failure elsewhere, e.g. a configuration source).
// Then it calls drain (readiness fails), keeps accepting for d.PreStop, gives
// api's requests up to d.Timeout to finish, ends the rest, and closes admin.
func Serve(ctx context.Context, api Server, apiLn net.Listener, admin *http.Server, adminLn net.Listener, errc <-chan error,
	drain func(), d Drain) error {
	served := make(chan error, 2)
	go func() {
		err := api.Serve(apiLn)
		if err == nil {
			err = http.ErrServerClosed
		}
		served <- err
	}()
	go func() { served <- admin.Serve(adminLn) }()
	var failed error
	select {
	case <-ctx.Done():
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			_ = admin.Close()
			return err
		}
	case failed = <-errc:
	}
	drain()
	if c, ok := api.(interface{ Closing() }); ok {
		c.Closing()
	}
	if d.PreStop > 0 {
		select {
		case <-time.After(d.PreStop):
		case err := <-served:
			if !errors.Is(err, http.ErrServerClosed) {
				_ = admin.Close()
				return err
			}
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), d.Timeout)
	defer cancel()
	err := api.Shutdown(shutdown)
	if a, ok := api.(interface{ Abort(error) }); ok && err != nil {
		// What is still running ends with an error its client can read.
		a.Abort(proxy.ErrShutdown)
		grace, stop := context.WithTimeout(context.Background(), abortGrace)
		if api.Shutdown(grace) == nil {
			err = nil
		}
		stop()
	}
	_ = admin.Close()
	switch {
	case failed != nil:
		return failed
	case err != nil:
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}
