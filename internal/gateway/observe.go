package gateway

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
}

const (
	maxObservedBody = 4 << 20
	maxSSELine      = 1 << 20
)

var usageKey = []byte(`"usage":{`)

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
	data, ok := bytes.CutPrefix(line, []byte("data: "))
	if !ok || !bytes.Contains(data, usageKey) {
		return
	}
	o.parse(data)
}

func (o *usageObserver) finish() {
	if !o.sse && !o.tooLong && bytes.Contains(o.body, usageKey) {
		o.parse(o.body)
	}
}

func (o *usageObserver) parse(b []byte) {
	var v struct {
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) == nil && v.Usage != nil {
		o.prompt, o.output, o.seen = v.Usage.Prompt, v.Usage.Completion, true
	}
}
