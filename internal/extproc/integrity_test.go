package extproc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/simserver"
)

// TestOneModelPerRequest: `kvgate epp`, picking or routing by body, refuses
// as `serve` does every body that names its model twice, in another spelling,
// or another than the header's — with an immediate 400, before the pick when
// the scanned head shows it, after it when it comes in the part that streams
// through — and what it releases to the model server never decodes (Go's
// encoding/json) to another model than the one routed.
func TestOneModelPerRequest(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	picker := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	bbr := startServer(t, gatewayConfig(pool(addrs...)), Options{BBR: NewBBR()})
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	pad := `"tools":["` + strings.Repeat("t", 3<<20) + `"]` // past the scanned head
	cuts := make([]int, 0, 64)
	for range 64 {
		cuts = append(cuts, 64<<10)
	}
	for _, tc := range []struct {
		name, body, header string
		bbr                bool
		want               int // 0: routed
		msg                string
	}{
		{"duplicate", `{"model":"` + llama + `","model":"other",` + msgs + `}`, "", false, 400, "more than once"},
		{"case variant", `{"model":"` + llama + `","Model":"other",` + msgs + `}`, "", false, 400, "more than once"},
		{"escape variant", `{"model":"` + llama + `","mod\u0065l":"other",` + msgs + `}`, "", false, 400, "more than once"},
		{"case variant alone", `{"MODEL":"` + llama + `",` + msgs + `}`, "", false, 400, "spelled"},
		{"header and body disagree", `{"model":"other",` + msgs + `}`, llama, false, 400, "header names"},
		{"header decides at once, body disagrees late", `{` + msgs + `,` + pad + `,"model":"other"}`, llama, false, 400, "header names"},
		{"duplicate past the head", `{"model":"` + llama + `",` + msgs + `,` + pad + `,"model":"other"}`, "", false, 400, "more than once"},
		{"bbr: duplicate", `{"model":"` + llama + `","model":"other",` + msgs + `}`, "", true, 400, "more than once"},
		{"bbr: duplicate past the head", `{"model":"` + llama + `",` + msgs + `,` + pad + `,"MODEL":"other"}`, "", true, 400, "more than once"},
		{"NaN past the head, then another model", `{"model":"` + llama + `",` + msgs + `,` + pad + `,"t":NaN,"model":"other"}`, "", false, 400, "is not JSON"},
		{"header decides at once, NaN, another model", `{` + msgs + `,"t":NaN,"model":"other"}`, llama, false, 400, "is not JSON"},
		{"bbr: Infinity past the head", `{"model":"` + llama + `",` + msgs + `,` + pad + `,"t":Infinity,"model":"other"}`, "", true, 400, "is not JSON"},
		{"one model", `{"model":"` + llama + `",` + msgs + `}`, "", false, 0, ""},
		{"header and body agree, late", `{` + msgs + `,` + pad + `,"model":"` + llama + `"}`, llama, false, 0, ""},
		{"bbr: one model, late", `{` + msgs + `,` + pad + `,"model":"` + llama + `"}`, "", true, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := picker
			if tc.bbr {
				s = bbr
			}
			req := request{body: []byte(tc.body), cuts: cuts, noUpstream: true}
			if tc.header != "" {
				req.headers = map[string]string{ModelHeader: tc.header}
			}
			p := s.play(t, req)
			var got struct {
				Model string `json:"model"`
			}
			if json.Unmarshal(p.upstreamBody, &got) == nil && got.Model != llama {
				t.Fatalf("released a body the model server reads as %q", got.Model)
			}
			if tc.want == 0 {
				if p.immediate != nil || !bytes.Equal(p.upstreamBody, []byte(tc.body)) {
					t.Fatalf("not routed whole: immediate %v, %d of %d bytes released", p.immediate, len(p.upstreamBody), len(tc.body))
				}
				return
			}
			ir := p.immediate
			if ir == nil || int(ir.GetStatus().GetCode()) != tc.want {
				t.Fatalf("immediate response %v, want %d", ir, tc.want)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if json.Unmarshal(ir.GetBody(), &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.msg) ||
				bytes.Contains(ir.GetBody(), []byte(`"param":"model"`)) == strings.Contains(tc.msg, "not JSON") {
				t.Fatalf("body %s, want an OpenAI error mentioning %q", ir.GetBody(), tc.msg)
			}
		})
	}
	picker.inFlightZero(t)
}

// TestRepeatedModelHeader: x-gateway-model-name given twice, or with two
// values in one line, is refused with 400 before the pick, as a body naming
// two models is: the picker and the model server could each read another.
func TestRepeatedModelHeader(t *testing.T) {
	addrs := startSims(t, 1, simserver.Options{})
	s := startServer(t, gatewayConfig(pool(addrs...)), Options{})
	body := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)
	for _, tc := range []struct {
		name  string
		lines [][2]string
		want  int // 0: routed
	}{
		{"two lines", [][2]string{{ModelHeader, llama}, {"X-Gateway-Model-Name", "other"}}, 400},
		{"the same model twice", [][2]string{{ModelHeader, llama}, {ModelHeader, llama}}, 400},
		{"two values in one line", [][2]string{{ModelHeader, llama + ", other"}}, 400},
		{"one", [][2]string{{ModelHeader, llama}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.play(t, request{body: body, more: tc.lines, noUpstream: true})
			if tc.want == 0 {
				if p.immediate != nil || !bytes.Equal(p.upstreamBody, body) {
					t.Fatalf("not routed: immediate %v", p.immediate)
				}
				return
			}
			ir := p.immediate
			if ir == nil || int(ir.GetStatus().GetCode()) != tc.want || !strings.Contains(string(ir.GetBody()), "names more than one model") ||
				!strings.Contains(string(ir.GetBody()), `"param":"model"`) {
				t.Fatalf("immediate response %v, want %d naming the header", ir, tc.want)
			}
			if len(p.upstreamBody) != 0 {
				t.Errorf("released %d bytes", len(p.upstreamBody))
			}
		})
	}
}
