package openai

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
)

func TestParsePrompt(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		want    Prompt
		wantErr bool
	}{
		{`"hello"`, Prompt{Text: "hello"}, false},
		{`["hello"]`, Prompt{Text: "hello"}, false},
		{`[1,2,3]`, Prompt{Tokens: []int{1, 2, 3}, IsIDs: true}, false},
		{`[[4,5]]`, Prompt{Tokens: []int{4, 5}, IsIDs: true}, false},
		{`["a","b"]`, Prompt{}, true},
		{`[[1],[2]]`, Prompt{}, true},
		{`5`, Prompt{}, true},
		{`{"x":1}`, Prompt{}, true},
		{``, Prompt{}, true},
		{`null`, Prompt{}, true},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			got, err := ParsePrompt(json.RawMessage(tc.raw))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got.Text != tc.want.Text || got.IsIDs != tc.want.IsIDs || !slices.Equal(got.Tokens, tc.want.Tokens) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestContentText(t *testing.T) {
	for _, tc := range []struct {
		raw, want string
		wantErr   bool
	}{
		{`"hi"`, "hi", false},
		{`null`, "", false},
		{`[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]`, "a\n[image_url]", false},
		{`42`, "", true},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			got, err := ChatMessage{Role: "user", Content: json.RawMessage(tc.raw)}.ContentText()
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	one, zero, two := 1, 0, 2
	for _, tc := range []struct {
		name string
		req  ChatRequest
		ok   bool
	}{
		{"ok", ChatRequest{Model: "m", Messages: []ChatMessage{{Role: "user"}}, MaxTokens: &one}, true},
		{"no model", ChatRequest{Messages: []ChatMessage{{Role: "user"}}}, false},
		{"no messages", ChatRequest{Model: "m"}, false},
		{"bad role", ChatRequest{Model: "m", Messages: []ChatMessage{{Role: "robot"}}}, false},
		{"zero max_tokens", ChatRequest{Model: "m", Messages: []ChatMessage{{Role: "user"}}, MaxTokens: &zero}, false},
		{"n=2", ChatRequest{Model: "m", Messages: []ChatMessage{{Role: "user"}}, N: &two}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.req.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, 404, TypeNotFound, "no such model")
	var body ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 404 || body.Error.Message != "no such model" || body.Error.Type != TypeNotFound || body.Error.Code != float64(404) {
		t.Fatalf("got %d %+v", rec.Code, body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
}

func FuzzParsePrompt(f *testing.F) {
	for _, s := range []string{`"x"`, `[1,2]`, `[[1]]`, `["a"]`, `null`, `{}`, `[`, `[[[]]]`, `[-1]`, `1e400`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := ParsePrompt(json.RawMessage(raw))
		if err != nil || p.IsIDs {
			return
		}
		// A text prompt survives a round trip through JSON unchanged.
		enc, _ := json.Marshal(p.Text)
		again, err := ParsePrompt(enc)
		if err != nil || again.Text != p.Text {
			t.Fatalf("%q: text %q does not round-trip: %q, %v", raw, p.Text, again.Text, err)
		}
	})
}
