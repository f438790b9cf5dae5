// Package gateway is kvgate's HTTP data plane: one OpenAI-compatible endpoint in
// front of many schedulers of model servers. A request's model (from the body, read
// only as far as needed, or from x-gateway-model-name) selects the scheduler; the routing
// core (internal/route) ranks its endpoints; the shared proxy streams the request
// to the best one and, if that one fails before any byte reached the client, to
// the next.
package gateway

import (
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/telemetry"
	"github.com/kvgate/kvgate/internal/tracing"
)

// Options configure a Gateway.
type Options struct {
	Logger  *slog.Logger
	Metrics *telemetry.Gateway
	// BodyReadTimeout bounds receiving a request body (default 60s): a client that
	// trickles its body gets 408 instead of holding a connection forever.
	BodyReadTimeout time.Duration
	Seed            uint64
	// Fleet tunes the metric scrapers (interval, staleness, ...).
	Fleet fleet.Config
	// ReadyWithoutConfig lets /readyz pass before any configuration: a
	// body-based router needs none.
	ReadyWithoutConfig bool
	// DecisionLogEvery logs one decision in this many, with every candidate's
	// scores, at debug level (default 100; 1 logs all).
	DecisionLogEvery int
	// SharedState links the replica to its peers (flags over the
	// configuration's spec.gateway.sharedState).
	SharedState SharedStateOptions
	// Tracing exports a span per request (nil: none); AccessLog writes a
	// line per request (nil: none).
	Tracing   *tracing.Provider
	AccessLog *tracing.AccessLog
}

// Gateway is the HTTP front of a routing core: ServeHTTP for the OpenAI API,
// AdminHandler for metrics, health and debug pages. The core's methods (Apply,
// Drain, Route, Summary, ...) are the embedded Router's.
type Gateway struct {
	*route.Router
	opts Options
	log  *slog.Logger
	// watcher gives up on endpoints that freeze while requests wait on them.
	watcher watcher
	// bodies bounds the request bytes held in memory (bodies.go).
	bodies bodyMemory
	// mesh links the replica to its peers, from the first configuration
	// with a shared state.
	meshMu   sync.Mutex
	mesh     *peers.Mesh
	meshSpec *v1alpha1.SharedStateSpec
	// tls is the API listener's TLS (kvgate serve), nil where spec.tls is
	// not served.
	tls *listenerTLS
}

// New returns a gateway with no configuration; it answers 503 until Apply.
func New(opts Options) *Gateway {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = telemetry.NewGateway()
	}
	if opts.BodyReadTimeout == 0 {
		opts.BodyReadTimeout = time.Minute
	}
	// Replicas started alike must not break ties alike: in step, they would
	// send their next requests to the same pod.
	if opts.Seed == 0 {
		opts.Seed = rand.Uint64()
	}
	r := route.New(route.Options{Logger: opts.Logger, Metrics: opts.Metrics, Seed: opts.Seed, Fleet: opts.Fleet, DecisionLogEvery: opts.DecisionLogEvery})
	return &Gateway{Router: r, opts: opts, log: opts.Logger}
}
