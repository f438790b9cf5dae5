// Package simtest starts simulated model servers for other packages' tests.
package simtest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kvgate/kvgate/internal/simserver"
)

// Start runs a simulated server on a free loopback port until the test ends. An
// empty model is "m"; an empty GPU is an H100 serving the 8B model; logs are
// discarded.
func Start(t testing.TB, opts simserver.Options) *simserver.Server {
	t.Helper()
	return StartAt(t, opts, "127.0.0.1:0")
}

// StartAt is Start on a given address (a pod IP on 127.0.0.x in Kubernetes tests).
func StartAt(t testing.TB, opts simserver.Options, addr string) *simserver.Server {
	t.Helper()
	if opts.Model == "" {
		opts.Model = "m"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Engine.GPU == "" {
		opts.Engine.GPU, opts.Engine.ModelSize = "h100", "8b"
	}
	s, err := simserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}
