package route

import (
	"bytes"
	"encoding/json"
)

// usageObserver finds the token usage in a response as it streams past: the usage
// object of a JSON body, or of the SSE chunk that carries it.
type usageObserver struct {
	sse     bool
	line    []byte // the SSE line being assembled
	body    []byte // a JSON body, up to maxObservedBody
	prompt  int64
	output  int64
	seen    bool
	tooLong bool
	events  int64 // SSE data lines but [DONE]
}

const (
	maxObservedBody = 4 << 20
	maxSSELine      = 1 << 20
)

var usageKey = []byte(`"usage"`)

// hasUsage says whether b holds a usage object: "usage", then a colon and a
// brace with any whitespace around them (servers that pretty-print, or
// Python's json.dumps defaults, write `"usage": {`). It is a cheap filter run
// on every event; parse decides.
func hasUsage(b []byte) bool {
	for {
		i := bytes.Index(b, usageKey)
		if i < 0 {
			return false
		}
		b = b[i+len(usageKey):]
		rest := bytes.TrimLeft(b, " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			rest = bytes.TrimLeft(rest[1:], " \t\r\n")
			if len(rest) > 0 && rest[0] == '{' {
				return true
			}
		}
	}
}

func (o *usageObserver) feed(p []byte) {
	if !o.sse {
		if !o.tooLong {
			if len(o.body)+len(p) > maxObservedBody {
				o.tooLong, o.body = true, nil
			} else {
				o.body = append(o.body, p...)
			}
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(o.line)+len(p) <= maxSSELine {
				o.line = append(o.line, p...)
			}
			return
		}
		o.line = append(o.line, p[:i]...)
		o.sseLine(o.line)
		o.line = o.line[:0]
		p = p[i+1:]
	}
}

func (o *usageObserver) sseLine(line []byte) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimPrefix(data, []byte(" "))
	if !bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
		o.events++
	}
	if hasUsage(data) {
		o.parse(data)
	}
}

func (o *usageObserver) finish() {
	if !o.sse && !o.tooLong && hasUsage(o.body) {
		o.parse(o.body)
	}
}

// usage is the usage object of the chat and completions APIs (prompt_tokens,
// completion_tokens) or of the Responses API (input_tokens, output_tokens).
type usage struct {
	Prompt     int64 `json:"prompt_tokens"`
	Completion int64 `json:"completion_tokens"`
	Input      int64 `json:"input_tokens"`
	Output     int64 `json:"output_tokens"`
}

func (o *usageObserver) parse(b []byte) {
	// The Responses API nests it in the response (response.completed events).
	var v struct {
		Usage    *usage `json:"usage"`
		Response *struct {
			Usage *usage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(b, &v) != nil {
		return
	}
	u := v.Usage
	if u == nil && v.Response != nil {
		u = v.Response.Usage
	}
	if u != nil {
		o.prompt, o.output, o.seen = u.Prompt+u.Input, u.Completion+u.Output, true
	}
}
