package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	big := strings.Repeat("word ", 50_000)
	for _, tc := range []struct {
		name, body string
		model      string
		found      bool
		syntax     bool
		err        bool
	}{
		{"first", `{"model":"m","messages":[]}`, "m", true, false, false},
		{"after messages", `{"messages":[{"role":"user","content":"hi"}],"model":"m2"}`, "m2", true, false, false},
		{"nested model ignored", `{"metadata":{"model":"no"},"model":"yes"}`, "yes", true, false, false},
		{"absent", `{"prompt":"x"}`, "", false, false, false},
		{"not string", `{"model":5}`, "", false, false, true},
		{"array body", `[1]`, "", false, false, true},
		{"truncated", `{"model":"m`, "", false, true, true},
		{"truncated before model", `{"messages":[`, "", false, true, true},
		{"garbage", `{"a":tru}`, "", false, true, true},
		{"empty", ``, "", false, true, true},
		{"a second model refused", `{"model":"a","model":"b"}`, "", false, false, true},
		{"escaped", `{"model":"a\"b\u00e9"}`, "a\"bé", true, false, false},
		{"escaped key", `{"mod\u0065l":"k"}`, "k", true, false, false},
		{"whitespace only", "  \n ", "", false, true, true},
		{"numbers", `{"t":-1.5E+3,"n":1e5,"model":"n"}`, "n", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var consumed bytes.Buffer
			r := strings.NewReader(tc.body)
			got, err := Scan(r, &consumed, 0)
			if (err != nil) != tc.err || (err == nil && (got.Model != tc.model || got.ModelFound != tc.found)) {
				t.Fatalf("got %q %v %v", got.Model, got.ModelFound, err)
			}
			var se *SyntaxError
			if errors.As(err, &se) != tc.syntax {
				t.Errorf("syntax error = %v, want %v (%v)", !tc.syntax, tc.syntax, err)
			}
			// What was consumed plus what is left is the body, byte for byte.
			rest, _ := io.ReadAll(r)
			if consumed.String()+string(rest) != tc.body {
				t.Errorf("consumed + rest != body")
			}
		})
	}
	// A model ahead of a large prompt stops the scan early.
	body := `{"model":"m","prompt":"` + big + `"}`
	var consumed bytes.Buffer
	if got, err := Scan(strings.NewReader(body), &consumed, 1024); err != nil || got.Model != "m" || len(got.Prompt) != 1024 {
		t.Fatal(got.Model, len(got.Prompt), err)
	}
	if consumed.Len() > 64<<10 {
		t.Errorf("scan read %d bytes of a %d-byte body to find a leading model", consumed.Len(), len(body))
	}
}

func TestScanPrompt(t *testing.T) {
	long := `"` + strings.Repeat("abcdefgh", 100_000) + `"`
	for _, tc := range []struct {
		name, body string
		limit      int
		model      string
		prompt     string
		maxRead    int // most bytes the scan may consume; 0: the whole body
	}{
		{"chat, model first", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, 100, "m", `[{"role":"user","content":"hi"}]`, 0},
		{"chat, model last", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"model":"m"}`, 100, "m", `[{"role":"user","content":"hi"}]`, 0},
		{"completion prompt cut to limit", `{"model":"m","prompt":"0123456789"}`, 4, "m", `"012`, 0},
		{"token prompt", `{"prompt":[1, 2,3],"model":"m"}`, 100, "m", `[1, 2,3]`, 0},
		{"responses input", `{"model":"m","input":"say"}`, 100, "m", `"say"`, 0},
		{"first prompt key wins", `{"model":"m","input":"a","prompt":"b"}`, 100, "m", `"a"`, 0},
		{"no prompt", `{"model":"m","max_tokens":3}`, 100, "m", "", 0},
		{"nested prompt key ignored", `{"model":"m","metadata":{"prompt":"x"}}`, 100, "m", "", 0},
		{"limit 0 ignores the prompt", `{"prompt":"x","model":"m"}`, 0, "m", "", 0},
		{"long prompt after the model stops early", `{"model":"m","prompt":` + long + `}`, 1000, "m", long[:1000], 64 << 10},
		{"long prompt before the model is read through", `{"prompt":` + long + `,"model":"m"}`, 10, "m", long[:10], 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var consumed bytes.Buffer
			consumed.WriteString("junk before") // Scan appends; earlier bytes are not its body
			r := strings.NewReader(tc.body)
			got, err := Scan(r, &consumed, tc.limit)
			if err != nil || got.Model != tc.model || string(got.Prompt) != tc.prompt {
				t.Fatalf("got model %q prompt %.40q err %v; want %q %.40q", got.Model, got.Prompt, err, tc.model, tc.prompt)
			}
			read := consumed.Len() - len("junk before")
			if tc.maxRead > 0 && read > tc.maxRead {
				t.Errorf("read %d bytes, want at most %d", read, tc.maxRead)
			}
			rest, _ := io.ReadAll(r)
			if consumed.String()[len("junk before"):]+string(rest) != tc.body {
				t.Errorf("consumed + rest != body")
			}
		})
	}
}

// TestScanPromptKnownModel: with the model known from a header, the scan stops
// at the prompt's head even when a model key would come later (left to Rest),
// and reports the body's model only when it read it.
func TestScanPromptKnownModel(t *testing.T) {
	long := `"` + strings.Repeat("abcdefgh", 100_000) + `"`
	for _, tc := range []struct {
		name, body, prompt string
		inBody             bool
		maxRead            int
	}{
		{"model last", `{"prompt":` + long + `,"model":"m"}`, long[:1000], false, 64 << 10},
		{"model first", `{"model":"m","prompt":` + long + `}`, long[:1000], true, 64 << 10},
		{"no prompt", `{"model":"m","max_tokens":3}`, "", true, 0},
		{"no prompt within the search bound", `{"tools":[` + long + `,` + long + `],"prompt":"late"}`, "", false, promptSearch + scanChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var consumed bytes.Buffer
			r := strings.NewReader(tc.body)
			got, err := ScanFor(r, &consumed, Want{PromptLimit: 1000, HeaderModel: "m"})
			if err != nil || got.ModelFound != tc.inBody || got.Model != "m" || string(got.Prompt) != tc.prompt {
				t.Fatalf("got model %q (in the body %v) prompt %.40q err %v; want m (%v), prompt %.40q", got.Model, got.ModelFound, got.Prompt, err, tc.inBody, tc.prompt)
			}
			if tc.maxRead > 0 && consumed.Len() > tc.maxRead {
				t.Errorf("read %d bytes, want at most %d", consumed.Len(), tc.maxRead)
			}
			rest, _ := io.ReadAll(r)
			if consumed.String()+string(rest) != tc.body {
				t.Errorf("consumed + rest != body")
			}
		})
	}
}

func FuzzScanModel(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"messages":[{"content":"x"}],"model":"y"}`, `{"a":{"model":"n"},"model":"o"}`, `[]`, `{`, `{"model":1}`, `{"model":"\ud800"}`, `  {"model" : "s" }  `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var consumed bytes.Buffer
		r := bytes.NewReader(body)
		got, err := Scan(r, &consumed, len(body)%300)
		model, found := got.Model, got.ModelFound
		rest, _ := io.ReadAll(r)
		if !bytes.Equal(append(consumed.Bytes(), rest...), body) {
			t.Fatal("consumed + rest != body")
		}
		// On a valid object with a single top-level model, the scan agrees with a
		// full decode.
		var full map[string]json.RawMessage
		if json.Unmarshal(body, &full) != nil || bytes.Count(body, []byte(`"model"`)) != 1 {
			return
		}
		var want string
		if raw, ok := full["model"]; ok && json.Unmarshal(raw, &want) == nil {
			if err != nil || !found || model != want {
				t.Fatalf("scan %q %v %v, full decode %q", model, found, err, want)
			}
		}
	})
}

// BenchmarkScan256KB scans a 256 KB chat body whose model comes last, as the
// OpenAI SDKs write it: the gateway's worst case.
func BenchmarkScan256KB(b *testing.B) {
	var content strings.Builder
	for content.Len() < 256<<10 {
		content.WriteString("The committee reviewed every clause of the agreement in detail. ")
	}
	body := []byte(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + content.String() + `"}],"max_tokens":1,"stream":true,"model":"m"}`)
	b.SetBytes(int64(len(body)))
	var consumed bytes.Buffer
	for b.Loop() {
		consumed.Reset()
		if got, err := Scan(bytes.NewReader(body), &consumed, 16384); err != nil || got.Model != "m" {
			b.Fatal(got.Model, err)
		}
	}
}
