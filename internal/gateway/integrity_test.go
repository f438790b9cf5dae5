package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
)

// recorder is a model server that reads every body to its end, decodes it as
// a Go model server would (encoding/json: last key wins, any case), and
// records the model of each body it completed. A body cut short is answered
// 400 and recorded as cut.
type recorder struct {
	mu     sync.Mutex
	models []string // the decoded model of every complete body
	cut    int
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	var req struct {
		Model string `json:"model"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	rec.mu.Lock()
	if err != nil {
		rec.cut++
	} else {
		rec.models = append(rec.models, req.Model)
	}
	rec.mu.Unlock()
	if err != nil {
		http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error","code":400}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, req.Model)
}

func (rec *recorder) completed() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.models...)
}

// startRecorder serves a recorder on loopback and returns it with its address.
func startRecorder(t *testing.T) (*recorder, string) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	return rec, strings.TrimPrefix(srv.URL, "http://")
}

// TestOneModelPerRequest: every way the issue found to route a body by one
// model while the model server runs another is refused with an OpenAI 400,
// whether the second model sits in the head kvgate reads or far behind it in
// the part that streams through; the model servers behind each pool, reading
// bodies as Go's encoding/json does, never complete a body naming a model
// other than their own.
func TestOneModelPerRequest(t *testing.T) {
	recA, addrA := startRecorder(t)
	recB, addrB := startRecorder(t)
	_, base := startGateway(t, gatewayConfig(scheduler("a", "model-a", addrA), scheduler("b", "model-b", addrB)))
	url := base + "/v1/chat/completions"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	// Past what the scan reads (promptSearch) before the rest streams.
	pad := `"tools":["` + strings.Repeat("t", 3<<20) + `"]`
	for _, tc := range []struct {
		name, body, header string
		chunked            bool
		want               int
		msg                string
	}{
		{"duplicate", `{"model":"model-a","model":"model-b",` + msgs + `}`, "", false, 400, "more than once"},
		{"case variant", `{"model":"model-a","Model":"model-b",` + msgs + `}`, "", false, 400, "more than once"},
		{"escape variant", `{"model":"model-a","mod\u0065l":"model-b",` + msgs + `}`, "", false, 400, "more than once"},
		{"case variant alone", `{"MODEL":"model-b",` + msgs + `}`, "", false, 400, `spelled "model", not "MODEL"`},
		{"case variant alone, past the head", `{` + msgs + `,` + pad + `,"Model":"model-a"}`, "model-a", false, 400, `spelled "model", not "Model"`},
		{"header and body disagree", `{"model":"model-b",` + msgs + `}`, "model-a", false, 400, "header names model \"model-a\""},
		{"duplicate past the head", `{"model":"model-a",` + msgs + `,` + pad + `,"model":"model-b"}`, "", false, 400, "more than once"},
		{"duplicate past the head, chunked", `{"model":"model-a",` + msgs + `,` + pad + `,"model":"model-b"}`, "", true, 400, "more than once"},
		{"case variant past the head", `{"model":"model-a",` + msgs + `,` + pad + `,"mOdel":"model-b"}`, "", false, 400, "more than once"},
		{"header, body disagrees past the head", `{` + msgs + `,` + pad + `,"model":"model-b"}`, "model-a", false, 400, "header names"},
		// Python's json reads NaN and Infinity and takes the last model: a
		// rest that stops being strict JSON is refused, not passed unchecked.
		{"NaN past the head, then another model", `{"model":"model-b",` + msgs + `,` + pad + `,"t":NaN,"model":"model-a"}`, "", false, 400, "is not JSON"},
		{"Infinity past the head, chunked", `{"model":"model-b",` + msgs + `,` + pad + `,"t":-Infinity,"model":"model-a"}`, "", true, 400, "is not JSON"},
		{"header, NaN, then another model", `{` + msgs + `,"t":NaN,"model":"model-a"}`, "model-b", false, 400, "is not JSON"},
		{"one model", `{"model":"model-a",` + msgs + `}`, "", false, 200, ""},
		{"escaped, once", `{"mod\u0065l":"model-b",` + msgs + `}`, "", false, 200, ""},
		{"header and body agree past the head", `{` + msgs + `,` + pad + `,"model":"model-a"}`, "model-a", true, 200, ""},
		{"model last, large", `{` + msgs + `,` + pad + `,"model":"model-b"}`, "", false, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // no length: sent chunked
			}
			req, _ := http.NewRequest("POST", url, body)
			if tc.header != "" {
				req.Header.Set("X-Gateway-Model-Name", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e apiError
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, raw)
			}
			if tc.want != 200 && (json.Unmarshal(raw, &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.msg) ||
				strings.Contains(string(raw), `"param":"model"`) == strings.Contains(tc.msg, "not JSON")) {
				t.Fatalf("error body %q, want an OpenAI error on param model with %q", raw, tc.msg)
			}
		})
	}
	// What each pool's server ran: its own model, only.
	for _, p := range []struct {
		rec   *recorder
		model string
		runs  int
	}{{recA, "model-a", 2}, {recB, "model-b", 2}} {
		got := p.rec.completed()
		for _, m := range got {
			if m != p.model {
				t.Errorf("the %s server completed a body it decodes as %q", p.model, m)
			}
		}
		if len(got) != p.runs {
			t.Errorf("the %s server completed %d bodies, want %d", p.model, len(got), p.runs)
		}
	}
	// The SDK, sending one model, is served.
	c := sdk(base)
	out, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "model-b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || out.Model != "model-b" {
		t.Fatalf("SDK: %v %v", out, err)
	}
}

// TestShortBody: a body shorter than its Content-Length, the client then
// closing its side, ends with an OpenAI 400 — wherever the body stops, before
// or after the model — and no model server completes it.
func TestShortBody(t *testing.T) {
	rec, addr := startRecorder(t)
	_, base := startGateway(t, gatewayConfig(scheduler("a", "model-a", addr)))
	host := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct{ name, sent, header string }{
		{"cut before the model", `{"messages":[{"role":"user","content":"hi"}],"mo`, ""},
		{"cut after the model", `{"model":"model-a","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"cut, model in the header", `{"messages":[{"role":"user","content":"hi"}]`, "X-Gateway-Model-Name: model-a\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", tc.header, len(tc.sent)+500, tc.sent)
			_ = conn.(*net.TCPConn).CloseWrite()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e apiError
			if resp.StatusCode != 400 && resp.StatusCode != 408 || json.Unmarshal(raw, &e) != nil || e.Error.Message == "" {
				t.Fatalf("status %d body %q, want a 400 or 408 OpenAI error", resp.StatusCode, raw)
			}
			if strings.Contains(e.Error.Message, "EOF") || strings.Contains(e.Error.Message, "127.0.0.1") {
				t.Errorf("Go's error text reached the client: %q", e.Error.Message)
			}
		})
	}
	if got := rec.completed(); len(got) != 0 {
		t.Errorf("the model server completed %d short bodies", len(got))
	}
}

// TestRepeatedModelHeader: x-gateway-model-name given twice, or with two
// values in one line, is refused with an OpenAI 400 on param model, as a body
// naming two models is, and reaches no model server.
func TestRepeatedModelHeader(t *testing.T) {
	rec, addr := startRecorder(t)
	_, base := startGateway(t, gatewayConfig(scheduler("a", "model-a", addr), scheduler("b", "model-b", addr)))
	body := `{"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name   string
		values []string
		want   int
	}{
		{"two lines", []string{"model-a", "model-b"}, 400},
		{"the same model twice", []string{"model-a", "model-a"}, 400},
		{"two values in one line", []string{"model-a, model-b"}, 400},
		{"one", []string{"model-b"}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(rec.completed())
			req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
			req.Header["X-Gateway-Model-Name"] = tc.values
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, raw)
			}
			if tc.want == 200 {
				return
			}
			var e apiError
			if json.Unmarshal(raw, &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "names more than one model") ||
				!strings.Contains(string(raw), `"param":"model"`) {
				t.Errorf("error body %s", raw)
			}
			if n := len(rec.completed()); n != before {
				t.Errorf("a model server completed the request")
			}
		})
	}
}

// TestNonJSONWhere: what configuration.md says of non-JSON. At the top level
// of the body's object (where a lenient decoder such as Python's json, which
// reads NaN and Infinity, could otherwise find another model) kvgate refuses
// it, in the head it reads and past it; inside a nested value it follows only
// strings and brackets, so the body goes on and the model server judges it.
func TestNonJSONWhere(t *testing.T) {
	_, addr := startRecorder(t)
	_, base := startGateway(t, gatewayConfig(scheduler("a", "model-a", addr)))
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	pad := `"tools":["` + strings.Repeat("t", 3<<20) + `"]`
	for _, tc := range []struct {
		name, body string
		forwarded  bool
	}{
		{"top level, in the head", `{"model":"model-a","t":NaN,` + msgs + `}`, false},
		{"top level, past the head", `{"model":"model-a",` + msgs + `,` + pad + `,"t":Infinity}`, false},
		{"nested, in the head", `{"model":"model-a","t":[NaN],` + msgs + `}`, true},
		{"nested, past the head", `{"model":"model-a",` + msgs + `,` + pad + `,"t":{"x":-Infinity}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The recorder, decoding as Go does, answers what it gets with 400
			// "bad body", relayed; kvgate's own refusal says malformed JSON.
			resp, raw, e := call(t, "POST", base+"/v1/chat/completions", tc.body)
			want := "malformed JSON body"
			if tc.forwarded {
				want = "bad body"
			}
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error.Message, want) {
				t.Fatalf("status %d %s, want 400 with %q", resp.StatusCode, raw, want)
			}
		})
	}
}
