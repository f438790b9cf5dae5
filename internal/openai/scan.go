package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrNotObject is returned by Scan when the body is not a JSON object.
var ErrNotObject = errors.New("the body must be a JSON object")

// ErrModelNotString is returned when the body's model is not a JSON string.
var ErrModelNotString = errors.New("'model' must be a string")

// SyntaxError is a body that is not the JSON it claims to be.
type SyntaxError struct{ Err error }

func (e *SyntaxError) Error() string { return "malformed JSON body: " + e.Err.Error() }
func (e *SyntaxError) Unwrap() error { return e.Err }

func malformed(format string, args ...any) error {
	return &SyntaxError{Err: fmt.Errorf(format, args...)}
}

// scanChunk is how much Scan reads at a time.
const scanChunk = 16 << 10

// spillAt is how much a scan with Want.Spill keeps in its buffer before it
// hands the bytes it no longer needs to Spill.
const spillAt = 512 << 10

// maxPinned bounds a key or a model or user value, which a scan holds whole
// while it reads it: no real one comes near.
const maxPinned = 64 << 10

// Scanned is what Scan found at the head of a body.
type Scanned struct {
	Model      string
	ModelFound bool
	// Prompt is the raw JSON of the first prompt-bearing value ("messages",
	// "prompt" or "input"), cut to the limit Scan was given. It aliases the
	// consumed buffer (or, with Spill, a copy): valid until that buffer is next
	// written.
	Prompt []byte
	// User is the top-level "user" string (OpenAI's end-user id), when the
	// scan was asked for it (Want.User) and found it.
	User string
	// Rest checks the part of the body the scan left unread, when it stopped
	// before the end of the top-level object: every later byte must go
	// through it (Guard.Check, or GuardReader) before it goes upstream. nil
	// when the scan read the whole object, or failed.
	Rest *Guard
}

// Want says what a scan reads a body for.
type Want struct {
	// PromptLimit is how many bytes of the prompt's head to keep; 0: none.
	PromptLimit int
	// HeaderModel is the model a header named, which routes the request. The
	// scan does not wait for the body's model, but a body that names another
	// one is refused (a ConflictError), here or in Rest.
	HeaderModel string
	// User: find the top-level "user" field too, within promptSearch bytes of
	// the model (it usually follows the prompt, which is then read whole).
	User bool
	// Spill, when set, takes the consumed bytes the scan no longer needs to
	// look at, in order, once its buffer holds spillAt bytes; they leave the
	// buffer, which then holds only the last of the consumed bytes. p is valid
	// only during the call. An error ends the scan with it. The buffer must be
	// empty when the scan starts.
	Spill func(p []byte) error
	// spillAt overrides the package's spillAt (tests).
	spillAt int
}

// promptSearch bounds how far past a leading model Scan looks for the prompt.
const promptSearch = 1 << 20

// Scan reads a JSON body from r only as far as routing needs, appending every byte
// it consumed to consumed, so that the caller can send consumed and then the rest
// of r on unchanged. Routing needs the top-level "model" string and, for prefix
// affinity, the first promptLimit bytes of the prompt; promptLimit 0 stops at the
// model.
//
// One model per body: Go's encoding/json takes the last of duplicate keys and
// matches them without regard to case, Python's takes the last exact one, and
// kvgate routes by one. A top-level key that any of them reads as "model" but
// is not exactly "model", or a second one, is refused (ConflictError) — here,
// or by Scanned.Rest in the part of the body that streams on unread.
//
// The prompt is kept as raw JSON, escapes and all: the prefix index only needs the
// same conversation to give the same bytes, and a chat's messages array grows by
// appending, so the raw JSON of an earlier turn is a prefix of the next one's.
//
// A body whose model and prompt prefix come first is not held in memory: the scan
// stops there and the rest streams through. The scanner checks the structure it
// walks (strings, nesting, separators) and leaves the full validation of values to
// the model server; it is hand-written because it is on every request's path and a
// 256 KB body costs it ~30 times less than encoding/json (BenchmarkScan256KB).
func Scan(r io.Reader, consumed *bytes.Buffer, promptLimit int) (Scanned, error) {
	return ScanFor(r, consumed, Want{PromptLimit: promptLimit})
}

// ScanFor is Scan reading for what w says.
func ScanFor(r io.Reader, consumed *bytes.Buffer, w Want) (Scanned, error) {
	s := scanner{r: r, buf: consumed, base: consumed.Len(), promptLimit: w.PromptLimit, promptStart: -1, promptEnd: -1,
		header: w.HeaderModel, modelFound: w.HeaderModel != "", wantUser: w.User, spill: w.Spill, spillAt: spillAt, pin: -1}
	if w.spillAt > 0 {
		s.spillAt = w.spillAt
	}
	s.pos = s.base
	s.mark = mark{at: s.base, state: gStart}
	if s.header != "" {
		// The header routes: give up on a prompt that has not begun within
		// promptSearch bytes rather than hold a body without one.
		s.stopAt = s.base + promptSearch
	}
	var err error
	if !s.done() {
		err = s.run()
	}
	stopped := errors.Is(err, errEnough) || err == nil && !s.closed
	if errors.Is(err, errEnough) {
		err = nil
	}
	out := Scanned{Model: s.model, ModelFound: s.bodyModel, User: s.user}
	if s.header != "" {
		out.Model = s.header
	}
	switch {
	case s.promptCopy != nil:
		out.Prompt = s.promptCopy
	case s.promptStart >= 0:
		end := s.pos
		if s.promptEnd >= 0 {
			end = s.promptEnd
		}
		out.Prompt = s.bytes(s.promptStart, min(end, s.promptStart+s.promptLimit))
	}
	if err == nil && stopped {
		// The rest streams unread: it is checked as it goes, from the last
		// point the scan holds, so that no top-level key escapes.
		g := &Guard{state: s.mark.state, model: s.mark.model, seen: s.modelKeys > 0, expect: s.header}
		if g.state != gStart {
			g.depth = 1 // inside the top-level object
		}
		if s.header == "" {
			g.expect = s.model
		}
		if gerr := g.Check(s.bytes(s.mark.at, s.end())); gerr != nil {
			return out, gerr
		}
		out.Rest = g
	}
	return out, err
}

// ScanBody is ScanFor over a body held whole, checked to its end by the
// scan's Rest: what ScanFor refuses and what a streaming front's Guard would
// refuse. w.Spill must be nil.
func ScanBody(body []byte, w Want) (Scanned, error) {
	var consumed bytes.Buffer
	sc, err := ScanFor(bytes.NewReader(body), &consumed, w)
	if err == nil && sc.Rest != nil {
		err = sc.Rest.Check(body[consumed.Len():])
	}
	return sc, err
}

// errEnough stops the scan once it holds what routing needs.
var errEnough = errors.New("enough of the body read")

// mark is a point of the top-level object a Guard can take over from.
type mark struct {
	at    int
	state gstate
	model bool // the value that follows is the body's model
}

// The scanner's offsets are absolute: counted from the start of the consumed
// buffer as it was, spilled bytes included; off is where buf now begins.
type scanner struct {
	r    io.Reader
	buf  *bytes.Buffer
	off  int  // absolute offset of buf.Bytes()[0]
	base int  // where this body starts
	pos  int  // next byte to look at
	eof  bool // r is exhausted

	spill   func([]byte) error
	spillAt int
	// pin is the start of a token being read whole (-1: none): it stays in
	// the buffer.
	pin int

	header     string // the model a header names
	model      string
	modelFound bool // the model is known (the body's, or the header's)
	bodyModel  bool // the body named it
	modelKeys  int
	closed     bool // the top-level object ended

	promptLimit            int
	promptStart, promptEnd int // the prompt value's span; -1 until seen
	promptCopy             []byte
	// stopAt, when positive, ends the scan once that many bytes were read.
	stopAt int
	// mark is where the last top-level step began, for a Guard to go on from.
	mark mark

	wantUser, userFound bool
	user                string
}

// bytes returns the consumed bytes from absolute offset i to j.
func (s *scanner) bytes(i, j int) []byte { return s.buf.Bytes()[i-s.off : j-s.off] }

// end is the absolute offset just past the consumed bytes.
func (s *scanner) end() int { return s.off + s.buf.Len() }

// done says whether the scan holds everything it was asked for.
func (s *scanner) done() bool {
	return s.modelFound && (s.promptLimit <= 0 || s.promptStart >= 0) && (!s.wantUser || s.userFound)
}

// more reads the next chunk of the body into the buffer.
func (s *scanner) more() error {
	if s.stopAt > 0 && s.end() >= s.stopAt {
		return errEnough
	}
	if s.eof {
		return malformed("unexpected end of body")
	}
	if s.spill != nil && s.buf.Len() >= s.spillAt {
		if err := s.release(); err != nil {
			return err
		}
	}
	s.buf.Grow(scanChunk)
	b := s.buf.AvailableBuffer()[:scanChunk]
	n, err := s.r.Read(b)
	s.buf.Write(b[:n])
	if errors.Is(err, io.EOF) {
		s.eof = true
		err = nil
	}
	if err != nil {
		return err
	}
	return nil
}

// release spills the bytes before the earliest one the scan may still look
// at: the token being read, the prompt's head (copied out once complete), and
// while the scan may stop early, the point a Guard would go on from.
func (s *scanner) release() error {
	keep := s.pos
	if s.pin >= 0 {
		keep = min(keep, s.pin)
	}
	if s.promptStart >= 0 && s.promptCopy == nil {
		if s.promptEnd < 0 && s.pos < s.promptStart+s.promptLimit {
			keep = min(keep, s.promptStart)
		} else if keep > s.promptStart {
			end := s.pos
			if s.promptEnd >= 0 {
				end = s.promptEnd
			}
			s.promptCopy = bytes.Clone(s.bytes(s.promptStart, min(end, s.promptStart+s.promptLimit)))
		}
	}
	if s.stopAt > 0 {
		keep = min(keep, s.mark.at)
	}
	if keep <= s.off {
		return nil
	}
	if err := s.spill(s.bytes(s.off, keep)); err != nil {
		return err
	}
	s.buf.Next(keep - s.off)
	s.off = keep
	return nil
}

// peek returns the next non-space byte without consuming it.
func (s *scanner) peek() (byte, error) {
	for {
		data := s.buf.Bytes()
		for s.pos-s.off < len(data) {
			switch c := data[s.pos-s.off]; c {
			case ' ', '\t', '\n', '\r':
				s.pos++
			default:
				return c, nil
			}
		}
		if err := s.more(); err != nil {
			return 0, err
		}
	}
}

func (s *scanner) expect(c byte) error {
	got, err := s.peek()
	if err != nil {
		return err
	}
	if got != c {
		return malformed("expected %q at byte %d, found %q", c, s.pos-s.base, got)
	}
	s.pos++
	return nil
}

func (s *scanner) run() error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c != '{' {
		return ErrNotObject
	}
	s.pos++
	s.mark = mark{at: s.pos, state: gKey}
	if c, err = s.peek(); err != nil {
		return err
	}
	if c == '}' {
		s.pos++
		s.closed = true
		return nil
	}
	for {
		raw, long, err := s.key()
		if err != nil {
			return err
		}
		k := keyOther
		if !long {
			k = classify(raw)
		}
		if k == keyModel || k == keyModelVariant {
			s.modelKeys++
			if err := modelKey(raw, k, s.modelKeys > 1); err != nil {
				return err
			}
		}
		s.mark = mark{at: s.pos, state: gColon, model: k == keyModel}
		if err := s.expect(':'); err != nil {
			return err
		}
		s.mark = mark{at: s.pos, state: gValue, model: k == keyModel}
		switch {
		case k == keyModel:
			if err := s.readModel(); err != nil {
				return err
			}
			s.mark = mark{at: s.pos, state: gAfter}
			if s.done() {
				return nil
			}
			if s.stopAt == 0 {
				s.stopAt = s.pos + promptSearch
			}
		case s.promptLimit > 0 && s.promptStart < 0 && k == keyPrompt:
			if _, err := s.peek(); err != nil {
				return err
			}
			s.promptStart = s.pos
			if s.modelFound && !s.wantUser {
				s.stopAt = s.pos + s.promptLimit
			}
			if err := s.skipValue(); err != nil {
				return err
			}
			s.promptEnd = s.pos
			s.mark = mark{at: s.pos, state: gAfter}
			if s.done() {
				return nil
			}
		case s.wantUser && !s.userFound && k == keyUser:
			if err := s.readUser(); err != nil {
				return err
			}
			s.mark = mark{at: s.pos, state: gAfter}
			if s.done() {
				return nil
			}
		default:
			if err := s.skipValue(); err != nil {
				return err
			}
			s.mark = mark{at: s.pos, state: gAfter}
		}
		c, err := s.peek()
		if err != nil {
			return err
		}
		s.pos++
		switch c {
		case ',':
			s.mark = mark{at: s.pos, state: gKey}
		case '}':
			s.closed = true
			return nil
		default:
			return malformed("expected ',' or '}' at byte %d, found %q", s.pos-1-s.base, c)
		}
	}
}

// key reads a top-level key. One too long to be a key routing reads is
// skipped, not held: long reports it.
func (s *scanner) key() (raw []byte, long bool, err error) {
	if _, err := s.peek(); err != nil {
		return nil, false, err
	}
	raw, err = s.str(true)
	if errors.Is(err, errLong) {
		_, err = s.strRest(-1)
		return nil, true, err
	}
	return raw, false, err
}

// modelKey checks a top-level key that decoders read as the model: it must be
// the only one, spelled "model" (escapes aside).
func modelKey(raw []byte, k keyKind, again bool) error {
	switch {
	case again:
		return &ConflictError{Reason: "the body names its model more than once; send a single \"model\" key"}
	case k == keyModelVariant:
		return &ConflictError{Reason: fmt.Sprintf("the body's model key must be spelled \"model\", not %s", raw)}
	}
	return nil
}

func (s *scanner) readModel() error {
	ok, err := s.readString("model", &s.model)
	if err == nil && !ok {
		return ErrModelNotString
	}
	if err != nil {
		return err
	}
	if s.header != "" && s.model != s.header {
		return headerConflict(s.header, s.model)
	}
	s.modelFound, s.bodyModel = true, true
	return nil
}

// HeaderModel is the model the x-gateway-model-name header names, from every
// value it came with ("" for none). The header given twice, or a value with a
// comma (two values joined, as RFC 9110 lets a proxy join repeated lines), is
// refused as a conflict: the picker and the model server could each read
// another name.
func HeaderModel(values []string) (string, error) {
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1 || strings.Contains(values[0], ","):
		return "", &ConflictError{Reason: "the x-gateway-model-name header names more than one model; send one"}
	}
	return values[0], nil
}

// headerConflict refuses a body that names a model the header does not.
func headerConflict(header, body string) error {
	return &ConflictError{Reason: fmt.Sprintf("the x-gateway-model-name header names model %q but the body names %q; send one model", header, body)}
}

// readUser reads the user field: a string, else it is skipped (the model
// server judges it).
func (s *scanner) readUser() error {
	ok, err := s.readString("user", &s.user)
	if errors.Is(err, errLong) {
		_, err = s.strRest(-1)
		return err
	}
	if err == nil && !ok {
		return s.skipValue()
	}
	s.userFound = ok
	return err
}

// readString decodes the string value of key into dst; it reports false,
// consuming nothing, when the value is not a string.
func (s *scanner) readString(key string, dst *string) (bool, error) {
	c, err := s.peek()
	if err != nil || c != '"' {
		return false, err
	}
	raw, err := s.str(true)
	if err != nil {
		if errors.Is(err, errLong) && key == "model" {
			return false, malformed("the model name is over %d bytes", maxPinned)
		}
		return false, err
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return false, malformed("%s: %v", key, err)
	}
	return true, nil
}

// errLong is a string too long to hold whole (maxPinned); the scan is left
// inside it.
var errLong = errors.New("string too long to hold")

// str consumes a string and, with keep, returns it with its quotes, escapes
// undecoded: valid until the next read, and held whole while it is read
// (errLong past maxPinned, the scan left inside it: strRest goes on). Without
// keep it returns nothing and holds nothing.
func (s *scanner) str(keep bool) ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := -1
	if keep {
		start = s.pos - 1
	}
	return s.strRest(start)
}

// strRest consumes the rest of a string the scan is inside, held from start
// when start is not -1.
func (s *scanner) strRest(start int) ([]byte, error) {
	if start >= 0 {
		s.pin = start
		defer func() { s.pin = -1 }()
	}
	for {
		data := s.buf.Bytes()
		i := s.pos - s.off
		for i < len(data) {
			j := bytes.IndexAny(data[i:], "\"\\")
			if j < 0 {
				i = len(data)
				break
			}
			i += j
			if data[i] == '\\' {
				if i+1 >= len(data) {
					break // the escaped byte has not arrived yet
				}
				i += 2
				continue
			}
			s.pos = s.off + i + 1
			if start < 0 {
				return nil, nil
			}
			return s.bytes(start, s.pos), nil
		}
		s.pos = s.off + i
		if start >= 0 && s.pos-start > maxPinned {
			return nil, errLong
		}
		if err := s.more(); err != nil {
			return nil, err
		}
	}
}

// skipValue consumes one value of any kind, however deep.
func (s *scanner) skipValue() error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	switch {
	case c == '"':
		_, err := s.str(false)
		return err
	case c == '{' || c == '[':
		return s.skipNested()
	case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
		return s.skipLiteral()
	default:
		return malformed("unexpected %q at byte %d", c, s.pos-s.base)
	}
}

// skipNested consumes an object or array, tracking depth and skipping strings.
func (s *scanner) skipNested() error {
	depth := 0
	for {
		c, err := s.peek()
		if err != nil {
			return err
		}
		switch c {
		case '"':
			if _, err := s.str(false); err != nil {
				return err
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		s.pos++
		if depth == 0 {
			return nil
		}
	}
}

// skipLiteral consumes a number, true, false or null, and checks it when it
// is short enough to be still in the buffer whole.
func (s *scanner) skipLiteral() error {
	start := s.pos
	for {
		data := s.buf.Bytes()
		for s.pos-s.off < len(data) {
			switch c := data[s.pos-s.off]; {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'E':
				s.pos++
			default:
				return s.checkLiteral(start)
			}
		}
		if s.eof {
			return s.checkLiteral(start)
		}
		if err := s.more(); err != nil {
			return err
		}
	}
}

func (s *scanner) checkLiteral(start int) error {
	if start < s.off {
		return nil // spilled: the model server judges it
	}
	if lit := s.bytes(start, s.pos); !json.Valid(lit) {
		return malformed("invalid literal %q at byte %d", lit, start-s.base)
	}
	return nil
}
