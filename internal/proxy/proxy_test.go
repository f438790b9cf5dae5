package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
)

func TestRequestID(t *testing.T) {
	for _, c := range []struct {
		name, in string
		kept     bool
	}{
		{"kept", "abc-123", true},
		{"128 characters kept", strings.Repeat("a", 128), true},
		{"too long", strings.Repeat("a", 129), false},
		{"empty", "", false},
		{"space", "a b", false},
		{"control character", "a\x01b", false},
		{"non-ASCII", "idé", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			if c.in != "" {
				h.Set("X-Request-Id", c.in)
			}
			got := RequestID(h)
			if c.kept != (got == c.in) {
				t.Errorf("RequestID(%q) = %q, kept %v", c.in, got, c.kept)
			}
			if !ValidRequestID(got) {
				t.Errorf("RequestID(%q) = %q, not a valid id itself", c.in, got)
			}
		})
	}
}

func TestRemoveHopHeaders(t *testing.T) {
	h := http.Header{"Connection": {"close, X-Hop"}, "X-Hop": {"1"}, "Transfer-Encoding": {"chunked"}, "Keep-Alive": {"x"}, "Content-Type": {"text/event-stream"}}
	RemoveHopHeaders(h)
	if len(h) != 1 || h.Get("Content-Type") == "" {
		t.Errorf("after removing hop-by-hop headers: %v", h)
	}
}

func TestBodyError(t *testing.T) {
	_, syntaxErr := openai.Scan(strings.NewReader(`{"model": tru`), &bytes.Buffer{}, 0)
	for _, c := range []struct {
		name   string
		err    error
		status int
		close  bool
		msg    string
	}{
		{"too large", fmt.Errorf("reading: %w", &http.MaxBytesError{Limit: 10}), 413, true, "request body exceeds 10 bytes"},
		{"stalled", fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded), 408, true, "the request body did not arrive in time"},
		{"not JSON", syntaxErr, 400, false, syntaxErr.Error()},
		{"not an object", openai.ErrNotObject, 400, false, openai.ErrNotObject.Error()},
		{"model not a string", openai.ErrModelNotString, 400, false, "'model' must be a string"},
		// Go's text (addresses, syscall names) never reaches the client.
		{"broken connection", errors.New("read tcp 10.1.2.3:8080->10.9.9.9:5555: connection reset by peer"), 400, true, "the request body could not be read to its end"},
		{"cut short", io.ErrUnexpectedEOF, 400, true, "the request body could not be read to its end"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, ok := BodyError(c.err)
			if !ok || r.Status != c.status || r.Close != c.close || r.Message != c.msg {
				t.Fatalf("BodyError(%v) = %+v, %v; want %d close=%v %q", c.err, r, ok, c.status, c.close, c.msg)
			}
			rec := httptest.NewRecorder()
			r.Write(rec)
			if rec.Code != c.status || (rec.Header().Get("Connection") == "close") != c.close ||
				!strings.Contains(rec.Body.String(), `"message":`) {
				t.Errorf("written: %d %v %s", rec.Code, rec.Header(), rec.Body)
			}
		})
	}
	if _, ok := BodyError(nil); ok {
		t.Error("BodyError(nil) refuses")
	}
}

func TestProxied(t *testing.T) {
	for path, want := range map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true,
		"/v1/responses": true, "/v1/models": false, "/v1/chat/completions/": false, "/metrics": false} {
		if Proxied(path) != want {
			t.Errorf("Proxied(%q) = %v", path, !want)
		}
	}
}

func TestRefusalRetryAfter(t *testing.T) {
	rec := httptest.NewRecorder()
	(&Refusal{Status: 429, Type: openai.TypeOverloaded, Message: "busy", RetryAfter: 2}).Write(rec)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Connection") != "" {
		t.Errorf("%d %v", rec.Code, rec.Header())
	}
}

func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		name   string
		ref    *Refusal
		status int
		header string // a header the refusal sets, name=value
		msg    string
	}{
		{"no route", NoRoute("POST", "/v1/nothing"), 404, "", "no route for POST /v1/nothing"},
		{"method", MethodNotAllowed("GET"), 405, "Allow=POST", "method GET not allowed; use POST"},
		{"missing model", MissingModel(), 400, "", noMatchingModel},
		{"unknown model", UnknownModel(), 404, "", noMatchingModel},
		{"no configuration", NoConfiguration(), 503, "Retry-After=1", "the gateway has no configuration yet"},
		{"too large", TooLarge(10), 413, "Connection=close", "request body exceeds 10 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c.ref.Write(rec)
			if rec.Code != c.status || !strings.Contains(rec.Body.String(), `"message":"`+c.msg+`"`) {
				t.Errorf("wrote %d %s, want %d %q", rec.Code, rec.Body, c.status, c.msg)
			}
			if name, value, ok := strings.Cut(c.header, "="); ok && rec.Header().Get(name) != value {
				t.Errorf("%s: %q, want %q", name, rec.Header().Get(name), value)
			}
		})
	}
}
