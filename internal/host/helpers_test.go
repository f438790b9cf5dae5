package host_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/servetest"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
)

const (
	llama = "meta-llama/Llama-3.1-8B-Instruct"
	qwen  = "Qwen/Qwen2.5-32B-Instruct"
)

var quiet = slog.New(slog.DiscardHandler)

// startSim runs a simulated server of model for the test.
func startSim(t testing.TB, model string, opts simserver.Options) *simserver.Server {
	opts.Model = model
	return simtest.Start(t, opts)
}

func scheduler(name, model string, endpoints ...string) v1alpha1.SchedulerSpec {
	return v1alpha1.SchedulerSpec{Name: name, ModelName: model, Endpoints: endpoints}
}

// config is a configuration of schedulers that names the endpoint that served
// each answer (x-kvgate-endpoint), which the tests read.
func config(schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
	cfg := &v1alpha1.InferenceGatewayConfig{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}}
	cfg.Name = "test"
	cfg.Spec.Schedulers = schedulers
	cfg.Spec.BBR.Enabled = true // more than one scheduler needs it
	cfg.Spec.Gateway.Diagnostics = &v1alpha1.DiagnosticsSpec{Expose: true}
	return cfg
}

// start serves cfg with kvgate serve's front over httptest until the test ends.
func start(t testing.TB, cfg *v1alpha1.InferenceGatewayConfig, core host.CoreOptions) *servetest.Server {
	t.Helper()
	return servetest.Start(t, cfg, core, gateway.Options{Logger: quiet})
}

// fromFile are Run's options for kvgate serve on the configuration file at
// path, on ports of the system's choosing.
func fromFile(path string) host.Options {
	return host.Options{ConfigPath: path, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DrainTimeout: 5 * time.Second, Logger: quiet}
}

// serveFile runs kvgate serve on a configuration file until the test ends;
// hup reloads it.
func serveFile(t *testing.T, path string, hup chan os.Signal) *servetest.Serving {
	t.Helper()
	o := fromFile(path)
	o.Reload = hup
	return servetest.Serve(t, o, gateway.Options{})
}

// configYAML is a configuration file of one scheduler over endpoints with the
// given queue weight; spec may go on after it.
func configYAML(weightQueue int, endpoints ...string) string {
	return fmt.Sprintf(`apiVersion: gateway.kvgate.io/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: host}
spec:
  schedulers:
  - name: p
    modelName: %s
    endpoints: ["%s"]
    weights: {queue: %d, kvCache: 2, prefix: 3}
  gateway:
    diagnostics: {expose: true}
`, llama, strings.Join(endpoints, `", "`), weightQueue)
}

func sdk(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0)}, opts...)...)
}

// chat is a chat completion request of model for up to tokens tokens.
func chat(model string, tokens int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":%d,"stream":%t}`, model, tokens, stream)
}

// send sends a request and reads its answer whole. One that cannot be sent
// fails the test (t.Error: any goroutine may send) and has status 0.
func send(t testing.TB, method, url, body string) (status int, header http.Header, text string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// post sends a chat request through the gateway at base and returns the
// endpoint that served it ("" when none did); an answer other than 200 fails
// the test.
func post(t testing.TB, base, body string) string {
	t.Helper()
	status, header, text := send(t, http.MethodPost, base+"/v1/chat/completions", body)
	if status != http.StatusOK && status != 0 {
		t.Errorf("status %d: %s", status, text)
	}
	return header.Get("X-Kvgate-Endpoint")
}

// adminText is a page of the admin listener at admin (host:port).
func adminText(t testing.TB, admin, path string) string {
	t.Helper()
	_, _, text := send(t, http.MethodGet, "http://"+admin+path, "")
	return text
}

// debugConfig is /debug/config: the configuration serving and the last load's
// outcome.
type debugConfig struct {
	Active   string `json:"active"`
	Accepted bool   `json:"lastReloadAccepted"`
	Error    string `json:"lastReloadError"`
	When     string `json:"lastReload"`
}

func readDebugConfig(t testing.TB, admin string) debugConfig {
	t.Helper()
	var d debugConfig
	if err := json.Unmarshal([]byte(adminText(t, admin, "/debug/config")), &d); err != nil {
		t.Fatal(err)
	}
	return d
}
