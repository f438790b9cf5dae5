package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ErrorJSONParam is ErrorJSON naming the request parameter at fault ("":
// none, param null).
func ErrorJSONParam(status int, typ, msg, param string) []byte {
	d := ErrorDetail{Message: msg, Type: typ, Code: status}
	if param != "" {
		d.Param = &param
	}
	body, _ := json.Marshal(ErrorBody{Error: d})
	return body
}

// WriteErrorParam is WriteError naming the request parameter at fault.
func WriteErrorParam(w http.ResponseWriter, status int, typ, msg, param string) {
	body := ErrorJSONParam(status, typ, msg, param)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
