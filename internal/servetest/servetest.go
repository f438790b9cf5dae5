// Package servetest runs kvgate serve — the host with the HTTP gateway as its
// front — for tests of the packages around it (tier 2, the Envoy picker's
// comparisons, dashboards, Kubernetes).
package servetest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

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
func Start(t testing.TB, cfg *v1alpha1.InferenceGatewayConfig, core host.CoreOptions, gw gateway.Options) *Server {
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

// Serving is kvgate serve running for a test (Serve): its listeners'
// addresses, and Run's end.
type Serving struct {
	host.Addrs
	stop context.CancelFunc
	done chan struct{}
	err  error
}

// startTimeout bounds the wait for kvgate serve's listeners; a start takes
// milliseconds, a Kubernetes source's first sync a few seconds.
const startTimeout = 30 * time.Second

// Serve runs kvgate serve (Run; o.Ready is its own) until Stop or the end of
// the test, and returns once the listeners accept. Run failing fails the test.
func Serve(t testing.TB, o host.Options, gw gateway.Options) *Serving {
	t.Helper()
	ready := make(chan host.Addrs, 1)
	o.Ready = ready
	ctx, stop := context.WithCancel(context.Background())
	s := &Serving{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = Run(ctx, o, gw)
	}()
	select {
	case s.Addrs = <-ready:
	case <-s.done:
		stop()
		t.Fatalf("kvgate serve did not start: %v", s.err)
	case <-time.After(startTimeout):
		stop()
		<-s.done
		t.Fatalf("kvgate serve did not start in %v", startTimeout)
	}
	t.Cleanup(func() {
		s.Stop()
		if err := s.Err(); err != nil {
			t.Errorf("kvgate serve: %v", err)
		}
	})
	return s
}

// Stop is the stop signal: the drain starts, and Done is closed once it is
// over.
func (s *Serving) Stop() { s.stop() }

// Done is closed when Run has returned.
func (s *Serving) Done() <-chan struct{} { return s.done }

// Err waits for Run to return and is its error.
func (s *Serving) Err() error {
	<-s.done
	return s.err
}
