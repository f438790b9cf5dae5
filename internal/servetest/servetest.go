// Package servetest runs kvgate serve — the host with the HTTP gateway as its
// front — for tests of the packages around it (tier 2, the Envoy picker's
// comparisons, dashboards, Kubernetes).
package servetest

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
)

// Mount is kvgate serve's front: the OpenAI HTTP API over the host's core,
// with spec.tls on its listener.
func Mount(gw gateway.Options) host.Mount {
	return func(_ context.Context, h *host.Host) (host.Front, error) {
		return h.HTTP(gateway.New(h.Router(), gw)), nil
	}
}

// Run is kvgate serve until ctx ends.
func Run(ctx context.Context, o host.Options, gw gateway.Options) error {
	o.Core.ListenerTLS = true
	if gw.Logger == nil {
		gw.Logger = o.Logger
	}
	o.Front = Mount(gw)
	return host.Run(ctx, o)
}

// Server is a gateway serving over httptest: its host (Apply, metrics, the
// core), the OpenAI API's URL and the admin listener's.
type Server struct {
	*host.Host
	URL, AdminURL string
}

// Start serves cfg until the test ends.
func Start(t testing.TB, cfg *v1alpha1.InferenceGatewayConfig, core host.Core, gw gateway.Options) *Server {
	t.Helper()
	if core.Logger == nil {
		core.Logger = gw.Logger
	}
	h := host.New(core)
	t.Cleanup(h.Close)
	if cfg != nil {
		if err := h.Apply(cfg); err != nil {
			t.Fatal(err)
		}
	}
	api := httptest.NewServer(gateway.New(h.Router(), gw))
	t.Cleanup(api.Close)
	admin := httptest.NewServer(h.AdminHandler())
	t.Cleanup(admin.Close)
	return &Server{Host: h, URL: api.URL, AdminURL: admin.URL}
}
