package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// StreamOptions is the stream_options object.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// CompletionRequest is the body of POST /v1/completions. Fields a server does not
// act on (temperature, top_p, ...) are accepted and ignored, as real servers do.
type CompletionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *StreamOptions  `json:"stream_options"`
	IgnoreEOS     bool            `json:"ignore_eos"`
	N             *int            `json:"n"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model               string          `json:"model"`
	Messages            []ChatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *StreamOptions  `json:"stream_options"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int            `json:"n"`
	Tools               json.RawMessage `json:"tools"`
}

// ChatMessage is one message; content is a string, an array of parts, or null.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// Prompt is a completion prompt: text, or token ids given directly.
type Prompt struct {
	Text   string
	Tokens []int
	IsIDs  bool
}

// ParsePrompt reads the prompt field: a string, an array of one string, an array of
// token ids, or an array of one such array. Several prompts in one request are
// refused because kvgate treats one request as one sequence.
func ParsePrompt(raw json.RawMessage) (Prompt, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return Prompt{}, errors.New("'prompt' is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return Prompt{Text: s}, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return Prompt{Tokens: ids, IsIDs: true}, nil
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		if len(strs) != 1 {
			return Prompt{}, fmt.Errorf("'prompt' holds %d prompts; send one prompt per request", len(strs))
		}
		return Prompt{Text: strs[0]}, nil
	}
	var nested [][]int
	if json.Unmarshal(raw, &nested) == nil {
		if len(nested) != 1 {
			return Prompt{}, fmt.Errorf("'prompt' holds %d prompts; send one prompt per request", len(nested))
		}
		return Prompt{Tokens: nested[0], IsIDs: true}, nil
	}
	return Prompt{}, errors.New("'prompt' must be a string, an array of strings, or an array of token ids")
}

// ContentText returns the text of a message's content: the string itself, or the
// text parts of an array joined by newlines. Non-text parts count as their type
// name so that they still occupy the prompt.
func (m ChatMessage) ContentText() (string, error) {
	raw := strings.TrimSpace(string(m.Content))
	if raw == "" || raw == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", errors.New("message 'content' must be a string or an array of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('\n')
		}
		if p.Type == "text" {
			b.WriteString(p.Text)
		} else {
			b.WriteString("[" + p.Type + "]")
		}
	}
	return b.String(), nil
}

// Validate checks the parts of a chat request every server needs.
func (r *ChatRequest) Validate() error {
	if r.Model == "" {
		return errors.New("'model' is required")
	}
	if len(r.Messages) == 0 {
		return errors.New("'messages' must contain at least one message")
	}
	for i, m := range r.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool", "developer", "function":
		default:
			return fmt.Errorf("messages[%d].role %q is not one of system, user, assistant, tool, developer", i, m.Role)
		}
	}
	return validateCommon(r.N, r.MaxTokens, r.MaxCompletionTokens)
}

// Validate checks the parts of a completion request every server needs.
func (r *CompletionRequest) Validate() error {
	if r.Model == "" {
		return errors.New("'model' is required")
	}
	return validateCommon(r.N, r.MaxTokens, nil)
}

func validateCommon(n, maxTokens, maxCompletion *int) error {
	if n != nil && *n != 1 {
		return fmt.Errorf("'n' = %d is not supported: only one choice per request", *n)
	}
	for _, v := range []*int{maxTokens, maxCompletion} {
		if v != nil && *v < 1 {
			return fmt.Errorf("'max_tokens' must be at least 1, got %d", *v)
		}
	}
	return nil
}
