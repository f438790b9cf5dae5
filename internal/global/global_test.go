package global

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

const llama = "meta-llama/Llama-3.1-8B-Instruct"

var quiet = slog.New(slog.DiscardHandler)

// tier1 is one member cluster: simulated model servers behind a real tier-1
// gateway, its API and admin listeners on loopback. kill and restart play a
// cluster that dies and comes back on the same addresses.
type tier1 struct {
	t          testing.TB
	host       *host.Host
	front      http.Handler
	api, admin *httptest.Server
	apiAddr    string
	adminAddr  string
	mu         sync.Mutex
}

func startTier1(t testing.TB, sims int, opts simserver.Options) *tier1 {
	t.Helper()
	opts.Model = llama
	var eps []string
	for range sims {
		eps = append(eps, simtest.Start(t, opts).Addr())
	}
	g := host.New(host.CoreOptions{Logger: quiet})
	t.Cleanup(g.Close)
	front := gateway.New(g.Router(), gateway.Options{Logger: quiet})
	cfg := &v1alpha1.InferenceGatewayConfig{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "t1"},
		Spec:       v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true}, Schedulers: []v1alpha1.SchedulerSpec{{Name: "llama", ModelName: llama, Endpoints: eps}}}}
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	m := &tier1{t: t, host: g, front: front}
	m.serve("127.0.0.1:0", "127.0.0.1:0")
	t.Cleanup(m.kill)
	return m
}

func (m *tier1) serve(apiAddr, adminAddr string) {
	m.t.Helper()
	listen := func(addr string) net.Listener {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			m.t.Fatal(err)
		}
		return ln
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.api = httptest.NewUnstartedServer(m.front)
	m.api.Listener = listen(apiAddr)
	m.api.Start()
	m.admin = httptest.NewUnstartedServer(m.host.AdminHandler())
	m.admin.Listener = listen(adminAddr)
	m.admin.Start()
	m.apiAddr, m.adminAddr = m.api.Listener.Addr().String(), m.admin.Listener.Addr().String()
}

// kill stops the cluster as a crash would: listeners closed, connections cut.
func (m *tier1) kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range []*httptest.Server{m.api, m.admin} {
		if s != nil {
			_ = s.Listener.Close()
			s.CloseClientConnections()
		}
	}
	m.api, m.admin = nil, nil
}

func (m *tier1) restart() { m.serve(m.apiAddr, m.adminAddr) }

func (m *tier1) member(name string, price float64) Member {
	return Member{Name: name, URL: "http://" + m.apiAddr, AdminURL: "http://" + m.adminAddr, PricePerMillionTokens: &price, Region: "us"}
}

func d(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }

// fastRouting is a configuration that notices changes quickly, for tests of
// failure detection.
func fastRouting() Routing {
	return Routing{HeartbeatInterval: d(100 * time.Millisecond), HeartbeatTimeout: d(600 * time.Millisecond), RampUp: d(3 * time.Second)}
}

// steadyRouting reads summaries as often but forgives a heartbeat that a
// loaded test machine delays: for tests that are not about failure detection.
func steadyRouting() Routing {
	r := fastRouting()
	r.HeartbeatTimeout = d(5 * time.Second)
	return r
}

func routerConfig(routing Routing, members ...Member) *Config {
	return &Config{APIVersion: APIVersion, Kind: Kind, Spec: Spec{Members: members, Routing: routing}}
}

// startRouter serves a router over httptest and waits until every member is
// healthy.
func startRouter(t testing.TB, cfg *Config, opts Options) (*Router, string) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	r := New(cfg, opts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.Start(ctx)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	waittest.Until(t, 10*time.Second, "every member healthy", func() bool {
		now := time.Now()
		g := r.gen.Load()
		for _, m := range g.members {
			v := m.evaluate(now, g.s)
			if l, ok := modelLoad(v.summary, llama); !v.healthy || !ok || l.ReadyEndpoints == 0 {
				return false
			}
		}
		return true
	})
	return r, srv.URL
}

func sdk(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0)}, opts...)...)
}

// memberOf captures the x-kvgate-member header of the response.
func memberOf(into *string) option.RequestOption {
	return option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(r)
		if err == nil {
			*into = resp.Header.Get("X-Kvgate-Member")
		}
		return resp, err
	})
}

func (r *Router) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Value(t, r.m.Registry, name, labels...)
}
