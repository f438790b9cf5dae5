package dashboards

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/global"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/waittest"
)

const (
	llama  = "meta-llama/Llama-3.1-8B-Instruct"
	apiKey = "sk-dashboards-test"
)

var quiet = slog.New(slog.DiscardHandler)

// live is a running kvgate: a tier-1 gateway (`kvgate serve` over a
// configuration file, sharing state through Redis) and a `kvgate global` in
// front of it and of a second, failing, tier-1 gateway.
type live struct {
	tier1Admin, globalAdmin string
	reload                  chan os.Signal
	configPath              string
}

// startLive runs kvgate and sends it the traffic that makes the series the
// dashboard and the rules read exist: answers, a stream, retries and an
// ejection, a shed request, a refused configuration, a failover, a rate-limit
// decision and an authentication refusal.
func startLive(t *testing.T) *live {
	t.Helper()
	redis := redistest.Start(t)
	sims := func(n int, model string, f simserver.Faults) []string {
		var eps []string
		for range n {
			eps = append(eps, simtest.Start(t, simserver.Options{Model: model, Faults: f}).Addr())
		}
		return eps
	}
	// An address nothing listens on: its scrapes fail, so the endpoint turns
	// unhealthy and its scheduler sheds.
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	_ = ln.Close()

	one := int32(1)
	cfg := &v1alpha1.InferenceGatewayConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "dashboards"},
		Spec: v1alpha1.InferenceGatewayConfigSpec{
			BBR: v1alpha1.BBRSpec{Enabled: true},
			Schedulers: []v1alpha1.SchedulerSpec{
				{Name: "llama", ModelName: llama, Endpoints: sims(2, llama, simserver.Faults{})},
				{Name: "broken", ModelName: "broken", Endpoints: sims(2, "broken", simserver.Faults{ErrorRate: 1})},
				{Name: "gone", ModelName: "gone", Endpoints: []string{gone}},
				// One slow endpoint: a second request while the first runs is
				// shed as saturated.
				{Name: "slow", ModelName: "slow", Endpoints: sims(1, "slow", simserver.Faults{AddedLatency: simserver.Duration(2 * time.Second)})},
			},
			Gateway: v1alpha1.GatewaySpec{
				OutlierDetection:       &v1alpha1.OutlierSpec{ConsecutiveFailures: &one},
				MaxInFlightPerEndpoint: &one,
				QueueTimeout:           &metav1.Duration{Duration: 50 * time.Millisecond},
				SharedState:            &v1alpha1.SharedStateSpec{Redis: redis.Addr(), Cluster: "dashboards"},
			},
		},
	}
	l := &live{reload: make(chan os.Signal, 1), configPath: filepath.Join(t.TempDir(), "gateway.yaml")}
	writeYAML(t, l.configPath, cfg)
	tier1 := servetest.Serve(t, host.Options{ConfigPath: l.configPath, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		DrainTimeout: time.Second, Reload: l.reload, Logger: quiet}, gateway.Options{})
	l.tier1Admin = "http://" + tier1.Admin
	waittest.Until(t, 10*time.Second, "endpoints scraped: llama healthy, gone unhealthy", func() bool {
		m := scrape(t, l.tier1Admin)
		return m.gauge("kvgate_endpoint_healthy", "scheduler", "llama") == 2 && m.has("kvgate_endpoint_healthy", "scheduler", "gone") &&
			m.gauge("kvgate_endpoint_healthy", "scheduler", "gone") == 0
	})

	c := client("http://"+tier1.API, "")
	for _, model := range []string{llama, llama, "broken", "broken", "gone"} {
		_, _ = c.Chat.Completions.New(context.Background(), chat(model))
	}
	first := make(chan error, 1)
	go func() { _, err := c.Chat.Completions.New(context.Background(), chat("slow")); first <- err }()
	waittest.Until(t, 10*time.Second, "a request in flight to the slow endpoint", func() bool {
		return scrape(t, l.tier1Admin).gauge("kvgate_endpoint_in_flight", "scheduler", "slow") == 1
	})
	var apiErr *openai.Error
	if _, err := c.Chat.Completions.New(context.Background(), chat("slow")); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request to the saturated endpoint: got %v, want 429", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first request to the slow endpoint: %v", err)
	}
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat(llama))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}

	// A refused configuration: the previous one keeps serving.
	if err := os.WriteFile(l.configPath, []byte("apiVersion: gateway.kvgate.io/v1alpha1\nkind: InferenceGatewayConfig\nspec: {schedulers: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.reload <- syscall.SIGHUP
	waittest.Until(t, 10*time.Second, "the bad configuration refused", func() bool {
		return scrape(t, l.tier1Admin).gauge("kvgate_config_last_reload_successful") == 0
	})

	// The second tier-1 gateway answers every request with an error: cheaper,
	// the global router tries it first and fails over to the first.
	bad := servetest.Start(t, &v1alpha1.InferenceGatewayConfig{TypeMeta: cfg.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true},
			Schedulers: []v1alpha1.SchedulerSpec{{Name: "llama", ModelName: llama, Endpoints: sims(1, llama, simserver.Faults{ErrorRate: 1})}}}},
		host.CoreOptions{Logger: quiet}, gateway.Options{Logger: quiet})

	cheap, dear := 0.1, 1.0
	heartbeat := &metav1.Duration{Duration: 100 * time.Millisecond}
	gcfg := &global.Config{APIVersion: global.APIVersion, Kind: global.Kind, Spec: global.Spec{
		Members: []global.Member{
			{Name: "cheap", URL: bad.URL, AdminURL: bad.AdminURL, PricePerMillionTokens: &cheap},
			{Name: "dear", URL: "http://" + tier1.API, AdminURL: l.tier1Admin, PricePerMillionTokens: &dear},
		},
		Models:    []global.ModelPolicy{{Name: llama, Limits: &global.Limits{RequestsPerMinute: 10000}}},
		Tenants:   []global.Tenant{{Name: "acme"}},
		Routing:   global.Routing{HeartbeatInterval: heartbeat, HeartbeatTimeout: &metav1.Duration{Duration: 5 * time.Second}},
		RateLimit: &global.RateLimit{Redis: redis.Addr()},
		Auth:      &v1alpha1.AuthSpec{APIKeys: []v1alpha1.APIKeySpec{{Tenant: "acme", Hash: auth.HashKey(apiKey)}}},
	}}
	gpath := filepath.Join(t.TempDir(), "global.yaml")
	writeYAML(t, gpath, gcfg)
	ctx, cancel := context.WithCancel(context.Background())
	gready := make(chan [2]string, 1)
	gdone := make(chan struct{})
	var grunErr error
	go func() {
		defer close(gdone)
		grunErr = global.Run(ctx, global.ServerOptions{ConfigPath: gpath, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
			DrainTimeout: time.Second, Ready: gready, Router: global.Options{Logger: quiet}})
	}()
	t.Cleanup(func() { cancel(); <-gdone })
	var gaddrs [2]string
	select {
	case gaddrs = <-gready:
	case <-gdone:
		t.Fatalf("kvgate global: %v", grunErr)
	case <-time.After(10 * time.Second):
		t.Fatal("kvgate global did not start in 10 s")
	}
	l.globalAdmin = "http://" + gaddrs[1]
	waittest.Until(t, 10*time.Second, "both members healthy", func() bool {
		m := scrape(t, l.globalAdmin)
		return m.gauge("kvgate_global_member_healthy", "member", "cheap") == 1 && m.gauge("kvgate_global_member_healthy", "member", "dear") == 1
	})
	good, wrong := client("http://"+gaddrs[0], apiKey), client("http://"+gaddrs[0], "sk-wrong")
	// The cheap member is picked first but for its ramp after start: a few
	// requests make one fail over.
	for i := 0; !scrape(t, l.globalAdmin).has("kvgate_global_failovers_total"); i++ {
		if i == 30 {
			t.Fatal("30 requests through kvgate global and none failed over from the failing member")
		}
		if _, err := good.Chat.Completions.New(context.Background(), chat(llama)); err != nil {
			t.Fatalf("through kvgate global: %v", err)
		}
	}
	if _, err := wrong.Chat.Completions.New(context.Background(), chat(llama)); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key: got %v, want 401", err)
	}
	// Without Redis, the rate limiter decides locally (failMode open).
	redis.Kill()
	if _, err := good.Chat.Completions.New(context.Background(), chat(llama)); err != nil {
		t.Fatalf("through kvgate global without Redis: %v", err)
	}
	return l
}

// exports gathers the families both processes export.
func (l *live) exports(t *testing.T) exports {
	t.Helper()
	ex := exports{}
	for _, m := range []metrics{scrape(t, l.tier1Admin), scrape(t, l.globalAdmin)} {
		for name, f := range m {
			ls := ex[name]
			if ls == nil {
				ls = map[string]map[string]bool{}
				ex[name] = ls
			}
			for _, s := range f.Metric {
				for _, lp := range s.Label {
					if ls[lp.GetName()] == nil {
						ls[lp.GetName()] = map[string]bool{}
					}
					ls[lp.GetName()][lp.GetValue()] = true
				}
				if h := s.Histogram; h != nil {
					if ls[model.BucketLabel] == nil {
						ls[model.BucketLabel] = map[string]bool{}
					}
					for _, b := range h.Bucket {
						// As client_golang writes it in the text format.
						ls[model.BucketLabel][strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)] = true
					}
					ls[model.BucketLabel]["+Inf"] = true
				}
			}
		}
	}
	return ex
}

type metrics map[string]*dto.MetricFamily

// scrape reads a /metrics page as Prometheus would, in the text format.
func scrape(t *testing.T, admin string) metrics {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", admin, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics: %v", admin, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return metrics(fams)
}

// series returns the samples of name whose labels include the pairs given.
func (m metrics) series(name string, pairs ...string) []*dto.Metric {
	f := m[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, s := range f.Metric {
		ok := true
		for i := 0; i+1 < len(pairs); i += 2 {
			found := false
			for _, lp := range s.Label {
				if lp.GetName() == pairs[i] && lp.GetValue() == pairs[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

func (m metrics) has(name string, pairs ...string) bool { return len(m.series(name, pairs...)) > 0 }

// gauge sums the gauges of name whose labels include the pairs given.
func (m metrics) gauge(name string, pairs ...string) float64 {
	sum := 0.0
	for _, s := range m.series(name, pairs...) {
		sum += s.GetGauge().GetValue()
	}
	return sum
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func client(base, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(cmpOr(key, "unused")), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
}

func chat(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:               model,
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello " + strings.Repeat("there ", 40))},
		MaxCompletionTokens: openai.Int(4),
		StreamOptions:       openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
}
