// Package host is the process around a front: the routing core built from the
// configuration file or a Kubernetes source and reloaded as it changes, the
// admin listener (metrics, health, debug, the fleet page), the peers mesh,
// the API listener's TLS and the drain. It mounts one front on the API
// listener — kvgate serve's HTTP gateway or kvgate epp's Envoy picker —
// handing it the core; the fronts know nothing of each other or of the host.
package host

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/serving"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// Front is a data plane the host serves on its API listener.
type Front = serving.Server

// CoreOptions configure the routing core and what the host keeps around it.
type CoreOptions struct {
	Logger  *slog.Logger
	Metrics *telemetry.Gateway
	Seed    uint64
	// Fleet tunes the metric scrapers (interval, staleness, ...).
	Fleet fleet.Config
	// DecisionLogEvery logs one decision in this many, with every candidate's
	// scores, at debug level (default 100; 1 logs all).
	DecisionLogEvery int
	// ReadyWithoutConfig lets /readyz pass before any configuration: a
	// body-based router needs none.
	ReadyWithoutConfig bool
	// SharedState links the replica to its peers (flags over the
	// configuration's spec.gateway.sharedState).
	SharedState SharedStateOptions
	// ListenerTLS serves spec.tls on the API listener (kvgate serve's HTTP
	// front; epp's gRPC listener has its own flags).
	ListenerTLS bool
	// Admin secures the admin listener.
	Admin AdminOptions
}

// Host holds the routing core and what lives beside it: the peers mesh and
// the API listener's TLS. Apply installs a configuration in all three.
type Host struct {
	core *route.Router
	opts CoreOptions
	log  *slog.Logger
	// mesh links the replica to its peers, from the first configuration
	// with a shared state.
	meshMu   sync.Mutex
	mesh     *peers.Mesh
	meshSpec *v1alpha1.SharedStateSpec
	// tls is the API listener's TLS, nil where spec.tls is not served.
	tls *listenerTLS
	// admin guards the admin listener's pages; adminErr is why it could not
	// be set up, which Run reports (AdminHandler then refuses every
	// protected page).
	admin    *AdminGate
	adminErr error
}

// New returns a host with no configuration: its core refuses with 503 until
// Apply.
func New(opts CoreOptions) *Host {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = telemetry.NewGateway()
	}
	// Replicas started alike must not break ties alike: in step, they would
	// send their next requests to the same pod.
	if opts.Seed == 0 {
		opts.Seed = rand.Uint64()
	}
	h := &Host{opts: opts, log: opts.Logger,
		core: route.New(route.Options{Logger: opts.Logger, Metrics: opts.Metrics, Seed: opts.Seed, Fleet: opts.Fleet, DecisionLogEvery: opts.DecisionLogEvery})}
	if opts.ListenerTLS {
		h.serveTLS()
	}
	h.admin, h.adminErr = NewAdminGate(opts.Admin, opts.Logger)
	return h
}

// Router is the routing core every front calls.
func (h *Host) Router() *route.Router { return h.core }

// Metrics are the core's metrics, served on /metrics.
func (h *Host) Metrics() *telemetry.Gateway { return h.core.Metrics() }

// RecordRejected notes a configuration that failed to load; the previous one
// keeps serving.
func (h *Host) RecordRejected(err error) { h.core.RecordRejected(err) }

// HTTP is an HTTP front served on the API listener, with spec.tls when the
// host serves it.
func (h *Host) HTTP(handler http.Handler) Front {
	api := serving.NewAPI(handler, h.log)
	api.TLS = h.TLSConfig
	return api
}

// Mount builds the front served on the API listener; ctx lasts until the
// drain is over.
type Mount func(ctx context.Context, h *Host) (Front, error)
