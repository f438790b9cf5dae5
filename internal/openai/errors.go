// Package openai holds the parts of the OpenAI HTTP API that kvgate's components
// share: request bodies, prompt extraction and the error body.
package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types as the OpenAI API and vLLM name them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "NotFoundError"
	TypeServer         = "server_error"
	TypeOverloaded     = "overloaded_error"
	TypeRateLimit      = "rate_limit_error"
	TypePermission     = "permission_error"
)

// ErrorBody is the JSON body of every error response:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the object inside ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// ErrorJSON is the body of an OpenAI-shaped error with the HTTP status as its
// code.
func ErrorJSON(status int, typ, msg string) []byte {
	body, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Message: msg, Type: typ, Code: status}})
	return body
}

// WriteError writes an OpenAI-shaped error with the HTTP status as its code.
func WriteError(w http.ResponseWriter, status int, typ, msg string) {
	body := ErrorJSON(status, typ, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
