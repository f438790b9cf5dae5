package openai

import (
	"bytes"
	"encoding/json"
)

// UsageReader finds the token usage in a response as it streams past: the
// usage object of a JSON body, or of the server-sent event that carries it.
type UsageReader struct {
	sse     bool
	line    []byte // the SSE line being assembled
	body    []byte // a JSON body, up to maxUsageBody
	prompt  int64
	output  int64
	seen    bool
	tooLong bool
	events  int64 // SSE data lines but [DONE]

	// The event being assembled, for the checks of the stream's shape: its
	// data lines joined by newlines, as the SSE specification joins them.
	lineCut, eventCut, hasData bool
	event                      []byte
	ended                      bool  // the stream's terminator was seen
	malformed                  int64 // events whose data is neither JSON nor [DONE]
}

// terminal are the Responses API's last events; chat and completions streams
// end with data: [DONE] instead.
var terminal = [][]byte{[]byte("response.completed"), []byte("response.incomplete"), []byte("response.failed")}

// Past these a body is not searched (a JSON answer that large is not a chat
// completion) and an SSE line is cut (its event is lost, not the stream).
const (
	maxUsageBody = 4 << 20
	maxSSELine   = 1 << 20
)

var usageKey = []byte(`"usage"`)

// NewUsageReader reads a server-sent event stream when sse is true, else a
// JSON body.
func NewUsageReader(sse bool) *UsageReader { return &UsageReader{sse: sse} }

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

// Feed passes the next bytes of the response.
func (u *UsageReader) Feed(p []byte) {
	if !u.sse {
		if !u.tooLong {
			if len(u.body)+len(p) > maxUsageBody {
				u.tooLong, u.body = true, nil
			} else {
				u.body = append(u.body, p...)
			}
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			u.appendLine(p)
			return
		}
		u.appendLine(p[:i])
		u.sseLine(u.line)
		u.line, u.lineCut = u.line[:0], false
		p = p[i+1:]
	}
}

func (u *UsageReader) appendLine(p []byte) {
	if u.lineCut || len(u.line)+len(p) > maxSSELine {
		u.lineCut = true
		return
	}
	u.line = append(u.line, p...)
}

func (u *UsageReader) sseLine(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		u.dispatch()
		return
	}
	if name, ok := bytes.CutPrefix(line, []byte("event:")); ok {
		name = bytes.TrimSpace(name)
		for _, t := range terminal {
			if bytes.Equal(name, t) {
				u.ended = true
			}
		}
		return
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimPrefix(data, []byte(" "))
	if !bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
		u.events++
	}
	if hasUsage(data) {
		u.parse(data)
	}
	if u.hasData {
		u.event = append(u.event, '\n')
	}
	u.hasData = true
	u.eventCut = u.eventCut || u.lineCut || len(u.event)+len(data) > maxSSELine
	if !u.eventCut {
		u.event = append(u.event, data...)
	}
}

// dispatch ends the event being assembled (at a blank line): [DONE] ends the
// stream; any other data must be JSON. An event cut for its size is not
// judged.
func (u *UsageReader) dispatch() {
	if u.hasData && !u.eventCut {
		d := bytes.TrimSpace(u.event)
		switch {
		case bytes.Equal(d, []byte("[DONE]")):
			u.ended = true
		case !json.Valid(d):
			u.malformed++
		}
	}
	u.event, u.hasData, u.eventCut = u.event[:0], false, false
}

// Finish judges what the stream left unterminated (a last line without its
// newline, a last event without its blank line) once it ended.
func (u *UsageReader) Finish() {
	if !u.sse {
		return
	}
	if len(u.line) > 0 {
		u.sseLine(u.line)
		u.line = u.line[:0]
	}
	u.dispatch()
}

// Ended says whether the event stream sent its terminator: data: [DONE]
// (chat and completions), or a Responses API last event.
func (u *UsageReader) Ended() bool { return u.ended }

// Malformed counts the events fed so far whose data is neither JSON nor
// [DONE].
func (u *UsageReader) Malformed() int64 { return u.malformed }

// Events counts the server-sent events with data fed so far, but [DONE]:
// about one token each, for a stream without usage.
func (u *UsageReader) Events() int64 { return u.events }

// Usage returns the usage found, once the whole response was fed.
func (u *UsageReader) Usage() (prompt, completion int64, ok bool) {
	if !u.sse && !u.tooLong && hasUsage(u.body) {
		u.parse(u.body)
	}
	return u.prompt, u.output, u.seen
}

// usage is the usage object of the chat and completions APIs (prompt_tokens,
// completion_tokens) or of the Responses API (input_tokens, output_tokens).
type usage struct {
	Prompt     int64 `json:"prompt_tokens"`
	Completion int64 `json:"completion_tokens"`
	Input      int64 `json:"input_tokens"`
	Output     int64 `json:"output_tokens"`
}

func (u *UsageReader) parse(b []byte) {
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
	us := v.Usage
	if us == nil && v.Response != nil {
		us = v.Response.Usage
	}
	if us != nil {
		u.prompt, u.output, u.seen = us.Prompt+us.Input, us.Completion+us.Output, true
	}
}
