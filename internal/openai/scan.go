package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrNotObject is returned by ScanModel when the body is not a JSON object.
var ErrNotObject = errors.New("the body must be a JSON object")

// ScanModel reads a JSON body from r only as far as it must to find the top-level
// "model" string, appending every byte it consumed to consumed, so that the caller
// can send consumed and then the rest of r on unchanged. found is false when the
// object ends without a model. The first "model" key wins.
//
// Routing needs only the model, so a large body whose model comes first is not
// held in memory: the scan stops at the model and the rest streams through.
func ScanModel(r io.Reader, consumed *bytes.Buffer) (model string, found bool, err error) {
	dec := json.NewDecoder(io.TeeReader(r, consumed))
	tok, err := dec.Token()
	if err != nil {
		return "", false, syntaxError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", false, ErrNotObject
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false, syntaxError(err)
		}
		key, _ := tok.(string)
		if key != "model" {
			if err := skipValue(dec); err != nil {
				return "", false, err
			}
			continue
		}
		v, err := dec.Token()
		if err != nil {
			return "", false, syntaxError(err)
		}
		s, ok := v.(string)
		if !ok {
			return "", false, errors.New("'model' must be a string")
		}
		return s, true, nil
	}
	if _, err := dec.Token(); err != nil {
		return "", false, syntaxError(err)
	}
	return "", false, nil
}

// skipValue consumes one JSON value, however deep.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// SyntaxError is a body that is not the JSON it claims to be.
type SyntaxError struct{ Err error }

func (e *SyntaxError) Error() string { return "malformed JSON body: " + e.Err.Error() }
func (e *SyntaxError) Unwrap() error { return e.Err }

func syntaxError(err error) error {
	var se *SyntaxError
	if errors.As(err, &se) {
		return err
	}
	// Reading errors (body too large, client gone) pass through for the caller.
	var jse *json.SyntaxError
	if errors.As(err, &jse) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return &SyntaxError{Err: fmt.Errorf("%w", err)}
	}
	return err
}
