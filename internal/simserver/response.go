package simserver

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// usage is the token accounting of a finished request.
type usage struct {
	Prompt, Completion, Cached int
}

func (u usage) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
		u.Prompt, u.Prompt+u.Completion, u.Completion, u.Cached), nil
}

// words are the simulated output vocabulary: short English words, each one token
// under internal/tokenizer when preceded by a space, so that the text a client
// receives counts as many tokens as the usage says.
var words = strings.Fields(`the of and to in is it that for on with as was at by an be this have from or one had not
but what all were when we there can your which their said if do will each about how up
out them then she many some so these would other into has more her two like him see time
could no make than first been its who now my made over did down only way find use may
water long very after words just where most know get back much go good new write our me
man too any day same right look think also came come work three word must does part even
place well such here take why help put away again off went old great tell men say small
every found still name home big give air line set own under read last never us left end
along while might next sound below saw both few those show large often asked house world
going want until form food keep feet land side boy once life took four head above kind
began live page got earth need far hand high year light let night being study soon story
since white ever paper hard near best today sure knew try told young sun thing whole
hear heard room sea top learn point city play five money seen car body upon later turn
move face door cut done group true leave color red eat front feel fact hour rock open`)

// spaced are the words with the space that makes each one token.
var spaced = func() []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = " " + w
	}
	return out
}()

// tokenText is the text of output token i of a sequence; it depends only on the
// server's seed, the sequence and i, so the same seed replays the same answers.
func tokenText(seed, seq uint64, i int) string {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(i))
	return spaced[xxhash.Sum64(b[:])%uint64(len(spaced))]
}

// responder writes a completion or chat response, whole or as server-sent events.
type responder struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	j       job
	seq     uint64
	seed    uint64
	id      string
	created int64
	started bool
	buf     []byte
	// prefix and suffix of every content chunk, built once.
	pre, post []byte
}

func newResponder(w http.ResponseWriter, j job, seq, seed uint64) *responder {
	r := &responder{w: w, rc: http.NewResponseController(w), j: j, seq: seq, seed: seed, created: time.Now().Unix()}
	model, _ := json.Marshal(j.model)
	if j.chat {
		r.id = fmt.Sprintf("chatcmpl-%016x", seq^seed<<32)
		r.pre = fmt.Appendf(nil, `data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,"delta":{"content":"`, r.id, r.created, model)
		r.post = []byte(`"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	} else {
		r.id = fmt.Sprintf("cmpl-%016x", seq^seed<<32)
		r.pre = fmt.Appendf(nil, `data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":"`, r.id, r.created, model)
		r.post = []byte(`","logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n")
	}
	return r
}

func (r *responder) start() {
	if r.started {
		return
	}
	r.started = true
	h := r.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	r.w.WriteHeader(http.StatusOK)
	if r.j.chat {
		model, _ := json.Marshal(r.j.model)
		r.buf = fmt.Appendf(r.buf, `data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n",
			r.id, r.created, model)
	}
}

// tokens streams output tokens [from, to) as one SSE event each, in one write.
func (r *responder) tokens(from, to int) error {
	r.start()
	for i := from; i < to; i++ {
		r.buf = append(r.buf, r.pre...)
		r.buf = append(r.buf, tokenText(r.seed, r.seq, i)...)
		r.buf = append(r.buf, r.post...)
	}
	return r.flush()
}

func (r *responder) flush() error {
	_, err := r.w.Write(r.buf)
	r.buf = r.buf[:0]
	if err != nil {
		return err
	}
	return r.rc.Flush()
}

// finish ends a stream: the finish reason, usage when asked for, and [DONE].
func (r *responder) finish(reason string, u usage) error {
	r.start()
	model, _ := json.Marshal(r.j.model)
	if r.j.chat {
		r.buf = fmt.Appendf(r.buf, `data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"%s"}]}`+"\n\n", r.id, r.created, model, reason)
	} else {
		r.buf = fmt.Appendf(r.buf, `data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"%s","stop_reason":null}]}`+"\n\n", r.id, r.created, model, reason)
	}
	if r.j.includeUsage {
		obj := "text_completion"
		if r.j.chat {
			obj = "chat.completion.chunk"
		}
		ub, _ := u.MarshalJSON()
		r.buf = fmt.Appendf(r.buf, `data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[],"usage":%s}`+"\n\n", r.id, obj, r.created, model, ub)
	}
	r.buf = append(r.buf, "data: [DONE]\n\n"...)
	return r.flush()
}

// whole writes a non-streaming response of n tokens.
func (r *responder) whole(n int, reason string, u usage) {
	var text strings.Builder
	for i := range n {
		text.WriteString(tokenText(r.seed, r.seq, i))
	}
	var body any
	if r.j.chat {
		body = map[string]any{
			"id": r.id, "object": "chat.completion", "created": r.created, "model": r.j.model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text.String()}, "logprobs": nil, "finish_reason": reason}},
			"usage":   u,
		}
	} else {
		body = map[string]any{
			"id": r.id, "object": "text_completion", "created": r.created, "model": r.j.model,
			"choices": []any{map[string]any{"index": 0, "text": text.String(), "logprobs": nil, "finish_reason": reason, "stop_reason": nil}},
			"usage":   u,
		}
	}
	b, _ := json.Marshal(body)
	h := r.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	r.w.WriteHeader(http.StatusOK)
	_, _ = r.w.Write(b)
}
