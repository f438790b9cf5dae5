// Package serving runs kvgate's two listeners — a data plane (the OpenAI API,
// or the ext_proc gRPC server) and the admin HTTP server — and drains them on
// stop; `kvgate serve`, `epp` and `global` share it.
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
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

// NewAPI is the HTTP server of an OpenAI API: bounded headers and idle
// connections, and net/http's own complaints (bad requests) at debug level.
func NewAPI(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// Serve runs api on apiLn and admin on adminLn until ctx ends, either fails, or
// a value arrives on errc (a failure elsewhere, e.g. a configuration source).
// Then it calls drain (readiness fails), gives api's requests up to timeout to
// finish, and closes admin.
func Serve(ctx context.Context, api Server, apiLn net.Listener, admin *http.Server, adminLn net.Listener, errc <-chan error,
	drain func(), timeout time.Duration) error {
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
	shutdown, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := api.Shutdown(shutdown)
	_ = admin.Close()
	switch {
	case failed != nil:
		return failed
	case err != nil:
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}
