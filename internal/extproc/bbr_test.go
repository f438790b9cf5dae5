package extproc

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/simserver"
)

// TestBBR: the body-based router copies the body's model into
// X-Gateway-Model-Name and an adapter's base model into
// X-Gateway-Base-Model-Name, clears the route cache, keeps the picker's control
// headers, and passes the body through unchanged — including a body over 1 MB
// whose last chunk arrives twice, and bodies it cannot read.
func TestBBR(t *testing.T) {
	sc := v1alpha1.SchedulerSpec{Name: "llama", ModelName: llama, LoRAAdapters: []string{"sql-lora"}, Endpoints: []string{"127.0.0.1:1"}}
	bbr := NewBBR()
	s := startServer(t, nil, Options{BBR: bbr})
	if err := s.gw.Apply(gatewayConfig(sc)); err != nil {
		t.Fatal(err)
	}
	bbr.SetSource("default/qwen", map[string]string{"qwen": "qwen", "qwen-finance": "qwen"})
	big := chatBody("sql-lora", strings.Repeat("select * from accounts; ", 48000)) // ~1.15 MB
	cuts := []int{}
	for range len(big)/50000 + 1 {
		cuts = append(cuts, 50000)
	}
	for _, tc := range []struct {
		name        string
		req         request
		model, base string // "" with noHeaders: nothing set
		noHeaders   bool
	}{
		{"base model", request{body: chatBody(llama, "hi")}, llama, llama, false},
		{"adapter from the configuration", request{body: chatBody("sql-lora", "hi")}, "sql-lora", llama, false},
		{"adapter from a ConfigMap", request{body: chatBody("qwen-finance", "hi")}, "qwen-finance", "qwen", false},
		{"unknown model: base set empty", request{body: chatBody("gpt-9", "hi")}, "gpt-9", "", false},
		{"over 1 MB with a duplicate end of stream", request{body: big, cuts: cuts, duplicateEOS: true}, "sql-lora", llama, false},
		{"model after a long prompt, small chunks", request{body: []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("z", 300000) + `"}],"model":"qwen"}`), cuts: slices.Repeat([]int{4096}, 80)}, "qwen", "qwen", false},
		{"no model", request{body: []byte(`{"messages":[]}`)}, "", "", true},
		{"no model, spoofed model headers", request{body: []byte(`{"messages":[]}`), headers: map[string]string{ModelHeader: "premium", BaseModelHeader: "premium"}}, "", "", true},
		{"model with a line break", request{body: []byte(`{"model":"llama
x-evil: 1"}`)}, "", "", true},
		{"not JSON", request{body: []byte("model=llama")}, "", "", true},
		{"trailers", request{body: chatBody(llama, "hi"), trailers: true}, llama, llama, false},
		{"no body", request{method: "GET", path: "/v1/models"}, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.noUpstream = true
			if tc.req.headers == nil {
				tc.req.headers = map[string]string{}
			}
			tc.req.headers["x-gateway-inference-objective"] = "batch"
			p := s.play(t, tc.req)
			if p.headers == nil || p.immediate != nil {
				t.Fatalf("no headers response (immediate %v)", p.immediate)
			}
			if !p.headers.GetClearRouteCache() || p.headers.GetHeaderMutation() == nil {
				t.Fatal("clear_route_cache must come with a header mutation")
			}
			model, hasModel := setHeader(p.headers, ModelHeader)
			base, hasBase := setHeader(p.headers, BaseModelHeader)
			if tc.noHeaders {
				if hasModel || hasBase {
					t.Fatalf("set model %q base %q on a body without a model", model, base)
				}
			} else if model != tc.model || base != tc.base || !hasBase {
				t.Fatalf("model %q base %q (set %v), want %q %q", model, base, hasBase, tc.model, tc.base)
			}
			if _, ok := setHeader(p.headers, DestinationHeader); ok || p.metadata != nil {
				t.Fatal("the router must not pick")
			}
			rm := p.headers.GetHeaderMutation().GetRemoveHeaders()
			if slices.Contains(rm, "x-gateway-inference-objective") {
				t.Fatalf("the router removed %v; the picker after it needs the control headers", rm)
			}
			for h := range tc.req.headers {
				if (h == ModelHeader || h == BaseModelHeader) && !slices.Contains(rm, h) {
					t.Errorf("client-sent %s survives a body without a model (removed %v)", h, rm)
				}
			}
			if !bytes.Equal(p.upstreamBody, tc.req.body) {
				t.Fatalf("body changed: %d bytes, want %d", len(p.upstreamBody), len(tc.req.body))
			}
			wantEOS := 1
			if tc.req.trailers || len(tc.req.body) == 0 {
				wantEOS = 0
			}
			if p.reqEOS != wantEOS {
				t.Fatalf("%d end-of-stream flags, want %d", p.reqEOS, wantEOS)
			}
		})
	}
	for result, want := range map[string]float64{"model": 4, "adapter": 3, "no_model": 3, "unreadable": 2} {
		if n := s.metric(t, "kvgate_bbr_requests_total", "result", result); n != want {
			t.Errorf("bbr %s: %v, want %v", result, n, want)
		}
	}
	bbr.SetSource("default/qwen", nil)
	if _, ok := bbr.BaseModel("qwen-finance"); ok {
		t.Error("a removed ConfigMap's adapters still map")
	}
}

// TestBBRThenPicker: the router and the picker chained as two ext_proc filters —
// the picker sees the router's output (its re-chunked body and the model
// header), and the body reaches the model server unchanged.
func TestBBRThenPicker(t *testing.T) {
	addrs := startSims(t, 2, simserver.Options{})
	router := startServer(t, nil, Options{BBR: NewBBR()})
	picker := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	body := []byte(`{"stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("q", 1_200_000) + `"}],"model":"` + llama + `","max_tokens":4}`)
	cuts := slices.Repeat([]int{65536}, len(body)/65536+1)
	r := router.play(t, request{body: body, cuts: cuts, duplicateEOS: true, noUpstream: true})
	model, _ := setHeader(r.headers, ModelHeader)
	// The picker gets the router's chunks as the router released them.
	routed := r.reqChunks
	p := picker.play(t, request{body: r.upstreamBody, cuts: routed, headers: map[string]string{ModelHeader: model}, duplicateEOS: true, noUpstream: true,
		holdAfter: 128 << 10})
	if dest := p.destination(t); !slices.Contains(addrs, dest[0]) {
		t.Fatalf("destination %v", dest)
	}
	if !bytes.Equal(p.upstreamBody, body) || p.reqEOS != 1 {
		t.Fatalf("after both filters the body differs (%d vs %d bytes) or has %d end-of-stream flags", len(p.upstreamBody), len(body), p.reqEOS)
	}
}
