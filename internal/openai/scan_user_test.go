package openai

import (
	"bytes"
	"strings"
	"testing"
)

// TestScanUser: asked for the user field, the scan finds it before or after
// the prompt, with the model known or not, and still keeps only the prompt's
// head; a non-string user is no user.
func TestScanUser(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		name, body string
		want       Want
		model      string
		user       string
		prompt     string
	}{
		{"user after the prompt", `{"model":"m","messages":[{"content":"` + long + `"}],"user":"u-1"}`, Want{PromptLimit: 16, User: true}, "m", "u-1", `[{"content":"xxx`},
		{"user before the model", `{"user":"u\u0032","model":"m","prompt":"hi"}`, Want{PromptLimit: 16, User: true}, "m", "u2", `"hi"`},
		{"model known", `{"messages":[],"user":"u-3"}`, Want{HeaderModel: "h", User: true}, "h", "u-3", ""},
		{"no user", `{"model":"m","messages":[]}`, Want{PromptLimit: 16, User: true}, "m", "", "[]"},
		{"user not a string", `{"model":"m","user":{"id":1},"messages":[]}`, Want{PromptLimit: 16, User: true}, "m", "", "[]"},
		{"not asked", `{"model":"m","messages":[],"user":"u-4"}`, Want{PromptLimit: 16}, "m", "", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var consumed bytes.Buffer
			sc, err := ScanFor(strings.NewReader(tc.body), &consumed, tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if sc.Model != tc.model || sc.User != tc.user || string(sc.Prompt) != tc.prompt {
				t.Fatalf("model %q user %q prompt %q, want %q %q %q", sc.Model, sc.User, sc.Prompt, tc.model, tc.user, tc.prompt)
			}
		})
	}
}
