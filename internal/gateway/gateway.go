// Package gateway is kvgate serve's front: the OpenAI HTTP API in front of the
// routing core. A request's model (from the body, read only as far as needed,
// or from x-gateway-model-name) selects the scheduler; the core (its Core)
// ranks the endpoints; the shared proxy streams the request to the best one
// and, if that one fails before any byte reached the client, to the next.
package gateway

import (
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/telemetry"
	"github.com/kvgate/kvgate/internal/tracing"
)

// Core is what the HTTP front needs of the routing core (route.Router).
type Core interface {
	// Current is the configuration a request is served under, taken once
	// when it arrives.
	Current() route.Config
	// CountRefused counts a request refused before it had a scheduler.
	CountRefused(status int)
	Metrics() *telemetry.Gateway
}

// Options configure a Gateway.
type Options struct {
	Logger *slog.Logger
	// BodyReadTimeout bounds receiving a request body (default 60s): a client that
	// trickles its body gets 408 instead of holding a connection forever.
	BodyReadTimeout time.Duration
	// Tracing exports a span per request (nil: none); AccessLog writes a
	// line per request (nil: none).
	Tracing   *tracing.Provider
	AccessLog *tracing.AccessLog
}

// Gateway is the HTTP front of a routing core: ServeHTTP for the OpenAI API.
type Gateway struct {
	core Core
	opts Options
	log  *slog.Logger
	// watcher gives up on endpoints that freeze while requests wait on them.
	watcher watcher
	// bodies bounds the request bytes held in memory (bodies.go).
	bodies bodyMemory
}

// New returns the HTTP front of core.
func New(core Core, opts Options) *Gateway {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BodyReadTimeout == 0 {
		opts.BodyReadTimeout = time.Minute
	}
	return &Gateway{core: core, opts: opts, log: opts.Logger}
}
