package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// ConflictError is a body that names its model in a way JSON decoders read
// differently from kvgate, or names another model than the header that
// routed it: the model server would run a model kvgate did not route by.
type ConflictError struct{ Reason string }

func (e *ConflictError) Error() string { return e.Reason }

// keyKind is what a top-level key means to routing.
type keyKind uint8

const (
	keyOther keyKind = iota
	keyModel
	// keyModelVariant is a key decoders read as the model but that is not
	// exactly "model": Go's encoding/json matches keys without regard to
	// case (Unicode folding), json/v2's nocase also ignores '_' and '-'.
	keyModelVariant
	keyPrompt
	keyUser
)

// classify says what a raw top-level key (quotes and escapes included) is.
func classify(raw []byte) keyKind {
	// No spelling of a key routing reads, even escaped, is this long.
	if len(raw) > 64 {
		return keyOther
	}
	k := string(raw[1 : len(raw)-1])
	if bytes.IndexByte(raw, '\\') >= 0 {
		if json.Unmarshal(raw, &k) != nil {
			return keyOther // decoders refuse the body
		}
	}
	switch k {
	case "model":
		return keyModel
	case "user":
		return keyUser
	case "messages", "prompt", "input":
		return keyPrompt
	}
	if strings.EqualFold(strings.NewReplacer("_", "", "-", "").Replace(k), "model") {
		return keyModelVariant
	}
	return keyOther
}

// gstate is where a Guard is in the top-level object.
type gstate uint8

const (
	gStart   gstate = iota // before the object
	gKey                   // a key or the object's end
	gInKey                 // inside a key
	gColon                 // after a key
	gValue                 // a top-level value
	gInModel               // inside the model's string value
	gInStr                 // inside a string being skipped
	gNested                // inside a nested object or array
	gLiteral               // inside a number, true, false or null
	gAfter                 // after a top-level value: ',' or '}'
	gDone                  // the object ended: the rest is not the object
	gLost                  // not JSON: refused (err is set)
)

// Guard checks, as a body streams past, that its top-level object names no
// other model than the one routed: a second key decoders read as "model", a
// variant spelling of it, or a model other than the header's is a
// ConflictError. It holds no more of the body than a key or the model's value.
// A body that stops being JSON is refused as malformed (a SyntaxError) at
// the first byte the Guard cannot place.
type Guard struct {
	state  gstate
	model  bool   // the value that follows is the body's model
	seen   bool   // the body already named its model
	expect string // the model routed
	depth  int    // nesting, 1 inside the top-level object
	esc    bool   // the last byte of a string was a backslash
	tok    []byte // the key or model value being read
	err    error
}

// NewGuard checks a whole body, from its first byte, for a model other than
// the one routed (from a header): a body that names none passes.
func NewGuard(routed string) *Guard { return &Guard{expect: routed} }

// Check reads the next bytes of the body; it returns a ConflictError once the
// body names another model, and keeps returning it.
func (g *Guard) Check(p []byte) error {
	for i := 0; i < len(p) && g.err == nil; {
		c := p[i]
		switch g.state {
		case gDone, gLost:
			return nil
		case gStart:
			switch {
			case space(c):
			case c == '{':
				g.state, g.depth = gKey, 1
			default:
				g.state, g.err = gLost, ErrNotObject
			}
		case gKey:
			switch {
			case space(c):
			case c == '"':
				g.state, g.tok = gInKey, append(g.tok[:0], c)
			case c == '}':
				g.state = gDone
			default:
				g.lose(c)
			}
		case gInKey, gInModel:
			i += g.token(p[i:])
			continue
		case gColon:
			switch {
			case space(c):
			case c == ':':
				g.state = gValue
			default:
				g.lose(c)
			}
		case gValue:
			switch {
			case space(c):
			case g.model && c == '"':
				g.state, g.tok = gInModel, append(g.tok[:0], c)
			case g.model:
				g.err = ErrModelNotString
			case c == '"':
				g.state = gInStr
			case c == '{' || c == '[':
				g.state, g.depth = gNested, 2
			case c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z':
				g.state = gLiteral
			default:
				g.lose(c)
			}
		case gInStr:
			i += g.skipString(p[i:])
			continue
		case gNested:
			j := bytes.IndexAny(p[i:], "\"{}[]")
			if j < 0 {
				return nil
			}
			i += j
			switch p[i] {
			case '"':
				g.state = gInStr
			case '{', '[':
				g.depth++
			default:
				g.depth--
				if g.depth == 1 {
					g.state = gAfter
				}
			}
		case gLiteral:
			if !literal(c) {
				g.state = gAfter
				continue // c ends the literal: read it after
			}
		case gAfter:
			switch {
			case space(c):
			case c == ',':
				g.state = gKey
			case c == '}':
				g.state = gDone
			default:
				g.lose(c)
			}
		}
		i++
	}
	return g.err
}

// lose ends the check at a byte that is not JSON. It fails closed: Python's
// json (and so the servers built on it) reads NaN and Infinity, and takes
// the last of two model keys, so a rest kvgate cannot follow could name
// another model; every strict decoder refuses such a body anyway.
func (g *Guard) lose(c byte) {
	g.state = gLost
	g.err = malformed("byte %q is not JSON where the body goes on (NaN, Infinity and other non-JSON values are refused)", c)
}

// literal says whether c may be part of a number, true, false or null.
func literal(c byte) bool {
	return c == '-' || c == '+' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == 'E'
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipString consumes string bytes up to and with its closing quote, and
// returns how many it took.
func (g *Guard) skipString(p []byte) int {
	for i := 0; i < len(p); {
		if g.esc {
			g.esc = false
			i++
			continue
		}
		j := bytes.IndexAny(p[i:], "\"\\")
		if j < 0 {
			return len(p)
		}
		i += j
		if p[i] == '\\' {
			if i+1 < len(p) {
				i += 2
				continue
			}
			g.esc = true
			return len(p)
		}
		if g.depth > 1 {
			g.state = gNested
		} else {
			g.state = gAfter
		}
		return i + 1
	}
	return len(p)
}

// token collects a key or the model's value up to its closing quote, returns
// how many bytes it took, and judges it once whole. Past maxPinned it keeps
// no more: the token is then too long to be a key or a model routing reads.
func (g *Guard) token(p []byte) int {
	for i := 0; i < len(p); i++ {
		switch {
		case g.esc:
			g.esc = false
		case p[i] == '\\':
			g.esc = true
		case p[i] == '"':
			g.keep(p[:i+1])
			if g.state == gInKey {
				g.judgeKey()
			} else {
				g.judgeModel()
			}
			return i + 1
		}
	}
	g.keep(p)
	return len(p)
}

func (g *Guard) keep(p []byte) {
	if len(g.tok) <= maxPinned {
		g.tok = append(g.tok, p...)
	}
}

// judgeKey reads a whole key: another model key is refused; the model's
// value is read next.
func (g *Guard) judgeKey() {
	g.state = gColon
	g.model = false
	if len(g.tok) > maxPinned {
		return // too long to be the model
	}
	k := classify(g.tok)
	if k != keyModel && k != keyModelVariant {
		return
	}
	if err := modelKey(g.tok, k, g.seen); err != nil {
		g.err = err
		return
	}
	g.seen, g.model = true, true
}

// judgeModel reads the body's model value, which must be the one routed.
func (g *Guard) judgeModel() {
	g.state, g.model = gAfter, false
	var m string
	if len(g.tok) > maxPinned || json.Unmarshal(g.tok, &m) != nil {
		g.err = &ConflictError{Reason: fmt.Sprintf("the body's model is not a readable string of at most %d bytes", maxPinned)}
		return
	}
	if m != g.expect {
		g.err = headerConflict(g.expect, m)
	}
}

// GuardReader is r with every byte read checked by g; a conflict is the
// read's error, and the bytes of that read are withheld. nil g: r.
func GuardReader(r io.Reader, g *Guard) io.Reader {
	if g == nil {
		return r
	}
	return &guardReader{r: r, g: g}
}

type guardReader struct {
	r io.Reader
	g *Guard
}

func (r *guardReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		if gerr := r.g.Check(p[:n]); gerr != nil {
			return 0, gerr
		}
	}
	return n, err
}
