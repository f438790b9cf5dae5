package simserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const testModel = "meta-llama/Llama-3.1-8B-Instruct"

// startServer runs a server on a loopback port for the duration of the test.
func startServer(t testing.TB, opts Options) (*Server, string) {
	t.Helper()
	if opts.Model == "" {
		opts.Model = testModel
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Engine.GPU == "" {
		opts.Engine.GPU, opts.Engine.ModelSize = "h100", "8b"
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, "http://" + s.Addr()
}

func sdk(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0)}, opts...)...)
}

// scrape parses the server's /metrics with the Prometheus text parser.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels include
// want, failing when there is no such series.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	v, ok := lookup(fams, name, want...)
	if !ok {
		t.Fatalf("no series %s%v in /metrics", name, want)
	}
	return v
}

func lookup(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// newestLoRAInfo returns the labels of the lora_requests_info series with the
// newest timestamp value, as consumers must read it.
func newestLoRAInfo(t *testing.T, fams map[string]*dto.MetricFamily) map[string]string {
	t.Helper()
	f, ok := fams["vllm:lora_requests_info"]
	if !ok {
		t.Fatal("no vllm:lora_requests_info")
	}
	var best map[string]string
	bestTS := -1.0
	for _, m := range f.GetMetric() {
		if v := m.GetGauge().GetValue(); v > bestTS {
			bestTS = v
			best = map[string]string{}
			for _, l := range m.GetLabel() {
				best[l.GetName()] = l.GetValue()
			}
		}
	}
	return best
}

// post sends a raw body and decodes an OpenAI error body when the status is not 200.
func post(t *testing.T, url, body string) (int, openaiError) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e openaiError
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Message == "" {
			t.Fatalf("status %d with a body that is not an OpenAI error: %q", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, e
}

type openaiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// putJSON PUTs v as JSON and returns the status.
func putJSON(t *testing.T, url string, v any) int {
	t.Helper()
	b, _ := json.Marshal(v)
	req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// getStatus GETs url and returns the status.
func getStatus(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
