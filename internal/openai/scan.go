package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// Scanned is what Scan found at the head of a body.
type Scanned struct {
	Model      string
	ModelFound bool
	// Prompt is the raw JSON of the first prompt-bearing value ("messages",
	// "prompt" or "input"), cut to the limit Scan was given. It aliases the
	// consumed buffer: it is valid until that buffer is next written.
	Prompt []byte
	// User is the top-level "user" string (OpenAI's end-user id), when the
	// scan was asked for it (Want.User) and found it.
	User string
}

// Want says what a scan reads a body for.
type Want struct {
	// PromptLimit is how many bytes of the prompt's head to keep; 0: none.
	PromptLimit int
	// ModelKnown: the model came another way (a header); do not look for it.
	ModelKnown bool
	// User: find the top-level "user" field too, within promptSearch bytes of
	// the model (it usually follows the prompt, which is then read whole).
	User bool
}

// promptSearch bounds how far past a leading model Scan looks for the prompt.
const promptSearch = 1 << 20

// Scan reads a JSON body from r only as far as routing needs, appending every byte
// it consumed to consumed, so that the caller can send consumed and then the rest
// of r on unchanged. Routing needs the top-level "model" string and, for prefix
// affinity, the first promptLimit bytes of the prompt; promptLimit 0 stops at the
// model. The first "model" key wins (a body naming the model twice is not checked
// further: the rest of it is never read).
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

// ScanPrompt is Scan for a caller that already knows the model (from a header):
// it does not look for one and stops as soon as it holds the prompt's head.
func ScanPrompt(r io.Reader, consumed *bytes.Buffer, promptLimit int) (Scanned, error) {
	return ScanFor(r, consumed, Want{PromptLimit: promptLimit, ModelKnown: true})
}

// ScanFor is Scan reading for what w says.
func ScanFor(r io.Reader, consumed *bytes.Buffer, w Want) (Scanned, error) {
	promptLimit, modelKnown := w.PromptLimit, w.ModelKnown
	s := scanner{r: r, buf: consumed, base: consumed.Len(), promptLimit: promptLimit, promptStart: -1, promptEnd: -1, modelFound: modelKnown,
		wantUser: w.User}
	s.pos = s.base
	if modelKnown {
		// Nothing but a prompt is wanted: give up on one that has not begun
		// within promptSearch bytes rather than hold a body without one.
		s.stopAt = s.base + promptSearch
	}
	err := s.run()
	if errors.Is(err, errEnough) {
		err = nil
	}
	out := Scanned{Model: s.model, ModelFound: s.modelFound && !modelKnown, User: s.user}
	if s.promptStart >= 0 {
		data := s.buf.Bytes()
		end := len(data)
		if s.promptEnd >= 0 {
			end = s.promptEnd
		}
		out.Prompt = data[s.promptStart:min(end, s.promptStart+promptLimit)]
	}
	return out, err
}

// errEnough stops the scan once it holds what routing needs.
var errEnough = errors.New("enough of the body read")

// promptKeys name the values the prefix index hashes.
var promptKeys = []string{"messages", "prompt", "input"}

type scanner struct {
	r    io.Reader
	buf  *bytes.Buffer
	base int  // where this body starts in buf
	pos  int  // next byte of buf.Bytes() to look at
	eof  bool // r is exhausted

	model      string
	modelFound bool

	promptLimit            int
	promptStart, promptEnd int // the prompt value's span in buf; -1 until seen
	// stopAt, when positive, ends the scan once buf holds that many bytes.
	stopAt int

	wantUser, userFound bool
	user                string
}

// done says whether the scan holds everything it was asked for.
func (s *scanner) done() bool {
	return s.modelFound && (s.promptLimit <= 0 || s.promptStart >= 0) && (!s.wantUser || s.userFound)
}

// more reads the next chunk of the body into the buffer.
func (s *scanner) more() error {
	if s.stopAt > 0 && s.buf.Len() >= s.stopAt {
		return errEnough
	}
	if s.eof {
		return malformed("unexpected end of body")
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

// peek returns the next non-space byte without consuming it.
func (s *scanner) peek() (byte, error) {
	for {
		data := s.buf.Bytes()
		for s.pos < len(data) {
			switch c := data[s.pos]; c {
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
	if c, err = s.peek(); err != nil {
		return err
	}
	if c == '}' {
		s.pos++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		switch {
		case !s.modelFound && keyIs(key, "model"):
			if err := s.readModel(); err != nil {
				return err
			}
			if s.done() {
				return nil
			}
			s.stopAt = s.pos + promptSearch
		case s.promptLimit > 0 && s.promptStart < 0 && isPromptKey(key):
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
			if s.done() {
				return nil
			}
		case s.wantUser && !s.userFound && keyIs(key, "user"):
			if err := s.readUser(); err != nil {
				return err
			}
			if s.done() {
				return nil
			}
		default:
			if err := s.skipValue(); err != nil {
				return err
			}
		}
		c, err := s.peek()
		if err != nil {
			return err
		}
		s.pos++
		switch c {
		case ',':
		case '}':
			return nil
		default:
			return malformed("expected ',' or '}' at byte %d, found %q", s.pos-1-s.base, c)
		}
	}
}

func (s *scanner) readModel() error {
	ok, err := s.readString("model", &s.model)
	if err == nil && !ok {
		return ErrModelNotString
	}
	s.modelFound = ok
	return err
}

// readUser reads the user field: a string, else it is skipped (the model
// server judges it).
func (s *scanner) readUser() error {
	ok, err := s.readString("user", &s.user)
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
	raw, err := s.str()
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return false, malformed("%s: %v", key, err)
	}
	return true, nil
}

func isPromptKey(raw []byte) bool {
	for _, k := range promptKeys {
		if keyIs(raw, k) {
			return true
		}
	}
	return false
}

// keyIs reports whether a raw key (with quotes) is name, escapes decoded.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return len(raw) == len(name)+2 && string(raw[1:len(raw)-1]) == name
	}
	var k string
	return json.Unmarshal(raw, &k) == nil && k == name
}

// str consumes a string and returns it with its quotes, escapes undecoded. The
// returned slice is valid until the next read.
func (s *scanner) str() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := s.pos - 1
	for {
		data := s.buf.Bytes()
		i := s.pos
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
			s.pos = i + 1
			return data[start:s.pos], nil
		}
		s.pos = i
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
		_, err := s.str()
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
			if _, err := s.str(); err != nil {
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

// skipLiteral consumes a number, true, false or null, and checks it.
func (s *scanner) skipLiteral() error {
	start := s.pos
	for {
		data := s.buf.Bytes()
		for s.pos < len(data) {
			switch c := data[s.pos]; {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'E':
				s.pos++
			default:
				return s.checkLiteral(data[start:s.pos])
			}
		}
		if s.eof {
			return s.checkLiteral(data[start:s.pos])
		}
		if err := s.more(); err != nil {
			return err
		}
	}
}

func (s *scanner) checkLiteral(lit []byte) error {
	if !json.Valid(lit) {
		return malformed("invalid literal %q at byte %d", lit, s.pos-s.base-len(lit))
	}
	return nil
}
