// Package proxy holds what both tiers do the same when they pass an OpenAI
// request on: which paths they proxy, the request id, the header policy
// (HeaderPolicy; hop-by-hop headers both ways), and the refusals both word
// alike, a request body that cannot be read among them.
package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/openai"
)

// Proxied reports whether path is an OpenAI endpoint kvgate forwards.
func Proxied(path string) bool {
	switch path {
	case "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses":
		return true
	}
	return false
}

// maxRequestID is the longest client x-request-id passed on; a longer one is
// replaced, so that logs and upstream headers stay bounded.
const maxRequestID = 128

// RequestID returns the client's X-Request-Id when it is one to pass on (1 to
// 128 visible ASCII characters), else a new random one.
func RequestID(h http.Header) string {
	if id := h.Get("X-Request-Id"); ValidRequestID(id) {
		return id
	}
	return NewRequestID()
}

// ValidRequestID reports whether a client's request id is one to pass on.
func ValidRequestID(id string) bool { return id != "" && len(id) <= maxRequestID && visible(id) }

// NewRequestID is a new random request id.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// hopHeaders are connection-level headers (RFC 9110 §7.6.1, and the
// non-standard ones proxies still meet) that no proxy forwards.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// RemoveHopHeaders deletes the connection-level headers from h, including
// those its Connection header names. Both tiers apply it to requests and
// responses alike.
func RemoveHopHeaders(h http.Header) { removeHop(h, h) }

// removeHop deletes from dst the hop-by-hop headers and those that src's
// Connection header names.
func removeHop(dst, src http.Header) {
	for _, v := range src.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				dst.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
}

// Refusal is a request kvgate answers itself: an HTTP status and an OpenAI
// error, with the Retry-After to send (0: none) and whether the connection
// is to be closed after it.
type Refusal struct {
	Status  int
	Type    string
	Message string
	// RetryAfter in whole seconds; 0 sends none.
	RetryAfter int
	// Close asks the client to open a new connection: the request's body
	// was not read to its end.
	Close bool
	// Challenge is the WWW-Authenticate value of a refusal for credentials.
	Challenge string
	// Param names the request parameter at fault, if one is.
	Param string
	// Allow is the Allow header of a refusal of the request's method.
	Allow string
}

func (e *Refusal) Error() string { return strconv.Itoa(e.Status) + ": " + e.Message }

// Write answers w with the refusal.
func (e *Refusal) Write(w http.ResponseWriter) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Close {
		w.Header().Set("Connection", "close")
	}
	if e.Challenge != "" {
		w.Header().Set("WWW-Authenticate", e.Challenge)
	}
	if e.Allow != "" {
		w.Header().Set("Allow", e.Allow)
	}
	openai.WriteErrorParam(w, e.Status, e.Type, e.Message, e.Param)
}

// JSON is the refusal's OpenAI error body.
func (e *Refusal) JSON() []byte { return openai.ErrorJSONParam(e.Status, e.Type, e.Message, e.Param) }

// NoRoute is the refusal of a path kvgate does not pass on.
func NoRoute(method, path string) *Refusal {
	return &Refusal{Status: http.StatusNotFound, Type: openai.TypeNotFound, Message: fmt.Sprintf("no route for %s %s", method, path)}
}

// MethodNotAllowed is the refusal of a method other than POST on a path
// kvgate passes on.
func MethodNotAllowed(method string) *Refusal {
	return &Refusal{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
		Message: "method " + method + " not allowed; use POST", Allow: http.MethodPost}
}

// noMatchingModel answers a request whose model cannot be routed, worded as
// AWS's gateway words it.
const noMatchingModel = "no matching model: set the model in the request body or the x-gateway-model-name header"

// MissingModel is the refusal of a request that names no model.
func MissingModel() *Refusal {
	return &Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: noMatchingModel}
}

// UnknownModel is the refusal of a model nothing serves, or one the client
// may not use: worded alike, so that a client cannot learn which models exist.
func UnknownModel() *Refusal {
	return &Refusal{Status: http.StatusNotFound, Type: openai.TypeNotFound, Message: noMatchingModel}
}

// NoConfiguration is the refusal of a request that arrives before any
// configuration.
func NoConfiguration() *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Message: "the gateway has no configuration yet", RetryAfter: 1}
}

// TooLarge is the refusal of a body larger than limit bytes.
func TooLarge(limit int64) *Refusal {
	return &Refusal{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest,
		Message: fmt.Sprintf("request body exceeds %d bytes", limit), Close: true}
}

// BodyError is the refusal for an error reading a client's request body:
// 413 past the size limit, 408 when it stalled past its read deadline, 400
// for a body that is not the JSON object an OpenAI request is (the scanner's
// own message), and 400 without Go's error text when the connection broke.
// ok is false for a nil error.
func BodyError(err error) (r *Refusal, ok bool) {
	var tooBig *http.MaxBytesError
	var syntax *openai.SyntaxError
	var conflict *openai.ConflictError
	switch {
	case err == nil:
		return nil, false
	case errors.As(err, &tooBig):
		return TooLarge(tooBig.Limit), true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &Refusal{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest,
			Message: "the request body did not arrive in time", Close: true}, true
	case errors.As(err, &conflict), errors.Is(err, openai.ErrModelNotString):
		return &Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: err.Error(), Param: "model"}, true
	case errors.As(err, &syntax), errors.Is(err, openai.ErrNotObject):
		return &Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: err.Error()}, true
	}
	return &Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest,
		Message: "the request body could not be read to its end", Close: true}, true
}
