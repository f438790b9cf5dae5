package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/simserver"
)

// TestBadInput sends malformed and hostile requests; each gets its status and an
// OpenAI-shaped error body, from the gateway or relayed from the model server.
func TestBadInput(t *testing.T) {
	_, addr := startSim(t, llama, simserver.Options{})
	cfg := gatewayConfig(scheduler("p", llama, addr))
	limit := int64(64 << 10)
	cfg.Spec.BBR.MaxRequestBodyBytes = &limit
	_, base := startGateway(t, cfg)
	chatURL := base + "/v1/chat/completions"
	for _, tc := range []struct {
		name, method, url, body string
		header                  []string
		status                  int
		msg                     string
	}{
		{"malformed JSON", "POST", chatURL, `{"model":`, nil, 400, "malformed JSON"},
		{"not JSON", "POST", chatURL, `hello`, nil, 400, "must be a JSON object"},
		{"bad literal", "POST", chatURL, `{"stream":tru,"model":"x"}`, nil, 400, "invalid literal"},
		{"missing colon", "POST", chatURL, `{"stream" true}`, nil, 400, "expected ':'"},
		{"array body", "POST", chatURL, `[{"model":"x"}]`, nil, 400, "must be a JSON object"},
		{"empty body", "POST", chatURL, ``, nil, 400, "malformed JSON"},
		{"model not a string", "POST", chatURL, `{"model":5}`, nil, 400, "'model' must be a string"},
		{"model null", "POST", chatURL, `{"model":null}`, nil, 400, "'model' must be a string"},
		{"missing model", "POST", chatURL, `{"messages":[]}`, nil, 400, "no matching model"},
		{"model only nested", "POST", chatURL, `{"metadata":{"model":"` + llama + `"}}`, nil, 400, "no matching model"},
		{"unknown model", "POST", chatURL, chat("gpt-9"), nil, 404, "no matching model: set the model in the request body or the x-gateway-model-name header"},
		{"unknown header model", "POST", chatURL, `{"messages":[]}`, []string{"X-Gateway-Model-Name", "nope"}, 404, "no matching model"},
		{"header and body disagree", "POST", chatURL, chat(llama), []string{"X-Gateway-Model-Name", "nope"}, 400, "the body names"},
		{"non-UTF-8 model", "POST", chatURL, "{\"model\":\"\xff\xfe\"}", nil, 404, "no matching model"},
		{"truncated after model", "POST", chatURL, `{"model":"` + llama + `","messages":[`, nil, 400, "malformed JSON body"},
		{"wrong method", "GET", chatURL, ``, nil, 405, "not allowed"},
		{"PUT", "PUT", chatURL, chat(llama), nil, 405, "not allowed"},
		{"unknown path", "POST", base + "/v1/nothing", chat(llama), nil, 404, "no route"},
		{"root path", "GET", base + "/", ``, nil, 404, "no route"},
		{"body too large", "POST", chatURL, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 70<<10) + `"}],"model":"` + llama + `"}`, nil, 413, "exceeds 65536 bytes"},
		{"negative max_tokens", "POST", chatURL, chat(llama, `"max_tokens":-5`), nil, 400, "max_tokens"},
		{"wrong type max_tokens", "POST", chatURL, chat(llama, `"max_tokens":"lots"`), nil, 400, "'max_tokens' must be a number"},
		{"bad role", "POST", chatURL, `{"model":"` + llama + `","messages":[{"role":"robot","content":"x"}]}`, nil, 400, "robot"},
		{"n too large", "POST", chatURL, chat(llama, `"n":5`), nil, 400, "'n'"},
		{"context too long", "POST", chatURL, chat(llama, `"max_tokens":100000000`), nil, 400, "maximum context length"},
		{"models wrong method", "POST", base + "/v1/models", `{}`, nil, 405, "use GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, e := call(t, tc.method, tc.url, tc.body, tc.header...)
			if resp.StatusCode != tc.status || !strings.Contains(e.Error.Message, tc.msg) || e.Error.Code != tc.status {
				t.Fatalf("got %d %+v, want %d containing %q", resp.StatusCode, e.Error, tc.status, tc.msg)
			}
		})
	}
}

// Hostile clients at the connection level: huge headers, a body that trickles in,
// a body that never ends.
func TestHostileClients(t *testing.T) {
	_, addr := startSim(t, llama, simserver.Options{})
	_, base := startGateway(t, gatewayConfig(scheduler("p", llama, addr)), func(o *setup) { o.BodyReadTimeout = 300 * time.Millisecond })
	host := strings.TrimPrefix(base, "http://")

	t.Run("huge headers", func(t *testing.T) {
		resp, _, _ := callRaw(t, host, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 200<<10)+"\r\nContent-Length: 2\r\n\r\n{}")
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	// A body that stalls before the model is found, or after it (the request
	// already on its way to the model server), gets a 408 either way.
	for name, head := range map[string]string{
		"slow-loris body":                 `{"mes`,
		"slow-loris body after the model": `{"model":"` + llama + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"user":"`,
	} {
		t.Run(name, func(t *testing.T) { slowLoris(t, host, head) })
	}
	t.Run("chunked body without length", func(t *testing.T) {
		resp, raw, _ := callRaw(t, host, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+
			chunked(chat(llama))+"0\r\n\r\n")
		if resp.StatusCode != 200 || !strings.Contains(string(raw), `"completion_tokens":4`) {
			t.Fatalf("status %d body %s", resp.StatusCode, raw)
		}
	})
}

func chunked(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		n := min(7, len(s))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", n, s[:n])
		s = s[n:]
	}
	return b.String()
}

// callRaw writes a raw HTTP/1.1 request and reads the response.
func callRaw(t *testing.T, host, raw string) (*http.Response, []byte, error) {
	t.Helper()
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	go func() { _, _ = io.WriteString(conn, raw) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body, nil
}

// slowLoris sends a request whose body stops after head, far short of its
// Content-Length, and expects a prompt 408 OpenAI error.
func slowLoris(t *testing.T, host, head string) {
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n%s", head)
	start := time.Now()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "did not arrive in time") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v to give up on a stalled body", d)
	}
}
