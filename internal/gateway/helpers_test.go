package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/promtest"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
)

const (
	llama = "meta-llama/Llama-3.1-8B-Instruct"
	qwen  = "Qwen/Qwen2.5-32B-Instruct"
)

var quiet = slog.New(slog.DiscardHandler)

// startSim runs a simulated model server for the test and returns it with its
// address.
func startSim(t testing.TB, model string, opts simserver.Options) (*simserver.Server, string) {
	t.Helper()
	opts.Model = model
	s := simtest.Start(t, opts)
	return s, s.Addr()
}

// scheduler builds a scheduler spec over static endpoints.
func scheduler(name, model string, endpoints ...string) v1alpha1.SchedulerSpec {
	return v1alpha1.SchedulerSpec{Name: name, ModelName: model, Endpoints: endpoints}
}

func gatewayConfig(schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
	return &v1alpha1.InferenceGatewayConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "test"},
		// Tests read which endpoint served (x-kvgate-endpoint), off by default.
		Spec: v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true}, Schedulers: schedulers,
			Gateway: v1alpha1.GatewaySpec{Diagnostics: &v1alpha1.DiagnosticsSpec{Expose: true}}},
	}
}

// setup is what a test may change of a gateway: the front's options and the
// core's.
type setup struct {
	Options
	Core host.CoreOptions
}

// fixture is a gateway under test: the routing core (its methods), the host
// around it (Apply installs TLS and peers too) and the HTTP front.
type fixture struct {
	*route.Router
	host  *host.Host
	front *Gateway
}

func (f *fixture) Apply(cfg *v1alpha1.InferenceGatewayConfig) error { return f.host.Apply(cfg) }
func (f *fixture) AdminHandler() http.Handler                       { return f.host.AdminHandler() }
func (f *fixture) Close()                                           { f.host.Close() }

// newFixture builds a gateway with no configuration.
func newFixture(opts ...func(*setup)) *fixture {
	o := setup{Options: Options{Logger: quiet}}
	for _, f := range opts {
		f(&o)
	}
	o.Core.Logger = o.Logger
	h := host.New(o.Core)
	return &fixture{Router: h.Router(), host: h, front: New(h.Router(), o.Options)}
}

// startGateway serves a gateway with cfg over httptest and returns it and its URL.
func startGateway(t testing.TB, cfg *v1alpha1.InferenceGatewayConfig, opts ...func(*setup)) (*fixture, string) {
	t.Helper()
	g := newFixture(opts...)
	t.Cleanup(g.Close)
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.front)
	srv.Config.MaxHeaderBytes = 64 << 10
	srv.Start()
	t.Cleanup(srv.Close)
	return g, srv.URL
}

// run is kvgate serve: the host with this front, until ctx ends.
func run(ctx context.Context, o host.Options) error {
	o.Core.ListenerTLS = true
	o.Front = func(_ context.Context, h *host.Host) (host.Front, error) {
		return h.HTTP(New(h.Router(), Options{Logger: o.Logger})), nil
	}
	return host.Run(ctx, o)
}

func sdk(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0)}, opts...)...)
}

// servedBy captures the x-kvgate-endpoint header of the response.
func servedBy(into *string) option.RequestOption {
	return option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(r)
		if err == nil {
			*into = resp.Header.Get("X-Kvgate-Endpoint")
		}
		return resp, err
	})
}

// counter reads a kvgate metric with the given labels (0 when absent).
func counter(t testing.TB, g *fixture, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Value(t, g.Metrics().Registry, name, labels...)
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// call sends a raw request and decodes an error body when the status is not 200.
func call(t testing.TB, method, url, body string, header ...string) (*http.Response, []byte, apiError) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e apiError
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Message == "" {
			t.Fatalf("status %d with a body that is not an OpenAI error: %q", resp.StatusCode, raw)
		}
	}
	return resp, raw, e
}

func chat(model string, extra ...string) string {
	s := `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":4`
	for _, e := range extra {
		s += "," + e
	}
	return s + "}"
}

// notMetrics answers the gateway's metric scrapes with 404 for test upstreams that
// are not model servers, so only proxied requests reach the test's handler. It
// reports whether it answered.
func notMetrics(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path == "/metrics" {
		http.NotFound(w, r)
		return true
	}
	return false
}
