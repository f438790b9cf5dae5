package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxLine is the longest trace line Read accepts: room for a prompt of hundreds of
// thousands of segments, while a corrupt file cannot make it buffer without bound.
const MaxLine = 16 << 20

// Write writes t as JSONL, one request per line.
func Write(w io.Writer, t Trace) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false) // ids are written as given, "<" and all
	for i := range t {
		if err := enc.Encode(&t[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Read parses a JSONL trace, strictly: a hand-edited trace with a typo should fail
// loudly rather than replay something else. Unknown fields, trailing data and bad
// values are errors naming the line; blank lines are skipped.
func Read(r io.Reader) (Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine+1) // +1: the newline
	var t Trace
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		q, err := parse(b)
		if err == nil {
			err = q.validate()
		}
		if err == nil && len(t) > 0 && q.At < t[len(t)-1].At {
			err = fmt.Errorf("t %g is before the previous request's %g", q.At, t[len(t)-1].At)
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		t = append(t, q)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, MaxLine)
		}
		return nil, err
	}
	return t, nil
}

func parse(b []byte) (Request, error) {
	var q Request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return q, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return q, errors.New("data after the request")
	}
	return q, nil
}

// validate checks a request's own values. Zero output tokens is refused too: it is
// what a missing output_tokens decodes to, and no server can serve it.
func (r Request) validate() error {
	switch {
	case r.At < 0:
		return fmt.Errorf("negative t %g", r.At)
	case r.Model == "":
		return errors.New("no model")
	case len(r.Prompt) == 0:
		return errors.New("no prompt segments")
	case r.OutputTokens <= 0:
		return fmt.Errorf("output_tokens %d, want > 0", r.OutputTokens)
	}
	for i, s := range r.Prompt {
		if s.ID == "" {
			return fmt.Errorf("prompt segment %d has no id", i)
		}
		if s.Tokens <= 0 {
			return fmt.Errorf("prompt segment %q has %d tokens, want > 0", s.ID, s.Tokens)
		}
	}
	return nil
}
