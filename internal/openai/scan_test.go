package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestScanModel(t *testing.T) {
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
		{"first key wins", `{"model":"a","model":"b"}`, "a", true, false, false},
		{"escaped", `{"model":"a\"b\u00e9"}`, "a\"bé", true, false, false},
		{"escaped key", `{"mod\u0065l":"k"}`, "k", true, false, false},
		{"whitespace only", "  \n ", "", false, true, true},
		{"numbers", `{"t":-1.5E+3,"n":1e5,"model":"n"}`, "n", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var consumed bytes.Buffer
			r := strings.NewReader(tc.body)
			model, found, err := ScanModel(r, &consumed)
			if (err != nil) != tc.err || model != tc.model || found != tc.found {
				t.Fatalf("got %q %v %v", model, found, err)
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
	if m, _, err := ScanModel(strings.NewReader(body), &consumed); err != nil || m != "m" {
		t.Fatal(m, err)
	}
	if consumed.Len() > 64<<10 {
		t.Errorf("scan read %d bytes of a %d-byte body to find a leading model", consumed.Len(), len(body))
	}
}

func FuzzScanModel(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"messages":[{"content":"x"}],"model":"y"}`, `{"a":{"model":"n"},"model":"o"}`, `[]`, `{`, `{"model":1}`, `{"model":"\ud800"}`, `  {"model" : "s" }  `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var consumed bytes.Buffer
		r := bytes.NewReader(body)
		model, found, err := ScanModel(r, &consumed)
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

// BenchmarkScanModel256KB scans a 256 KB chat body whose model comes last, as the
// OpenAI SDKs write it: the gateway's worst case.
func BenchmarkScanModel256KB(b *testing.B) {
	var content strings.Builder
	for content.Len() < 256<<10 {
		content.WriteString("The committee reviewed every clause of the agreement in detail. ")
	}
	body := []byte(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + content.String() + `"}],"max_tokens":1,"stream":true,"model":"m"}`)
	b.SetBytes(int64(len(body)))
	var consumed bytes.Buffer
	for b.Loop() {
		consumed.Reset()
		if m, _, err := ScanModel(bytes.NewReader(body), &consumed); err != nil || m != "m" {
			b.Fatal(m, err)
		}
	}
}
