package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// front is what a front end does with a body: it scans the head (spilling
// every spillAt bytes when spillAt > 0), then streams the rest through the
// scan's Guard in reads of at most chunk bytes. It returns the model it
// routed by and every byte that went on, in order.
func front(body []byte, header string, limit, chunk, spillAt int) (string, []byte, error) {
	var r io.Reader = bytes.NewReader(body)
	if chunk > 0 {
		r = &smallReads{r: r, n: chunk}
	}
	var sent, head bytes.Buffer
	w := Want{PromptLimit: limit, HeaderModel: header}
	if spillAt > 0 {
		w.spillAt = spillAt
		w.Spill = func(p []byte) error { sent.Write(p); return nil }
	}
	sc, err := ScanFor(r, &head, w)
	if err != nil {
		return "", nil, err
	}
	if header == "" && !sc.ModelFound {
		return "", nil, errors.New("no model")
	}
	sent.Write(head.Bytes())
	if _, err := io.Copy(&sent, GuardReader(r, sc.Rest)); err != nil {
		return "", nil, err
	}
	return sc.Model, sent.Bytes(), nil
}

type smallReads struct {
	r io.Reader
	n int
}

func (s *smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }

// TestOneModel: every way of naming a second model, or a variant spelling,
// is refused wherever it sits, in the scanned head or in the part that
// streams unread; one model, however spelled exactly, routes.
func TestOneModel(t *testing.T) {
	pad := `"` + strings.Repeat("p", 3<<20) + `"` // past promptSearch: the scan stops before what follows
	for _, tc := range []struct {
		name, body, header string
		model              string // "" : refused
	}{
		{"one model", `{"model":"a","messages":[]}`, "", "a"},
		{"duplicate", `{"model":"model-a","model":"model-b","messages":[]}`, "", ""},
		{"duplicate after the prompt", `{"model":"a","messages":[{"content":"x"}],"model":"b"}`, "", ""},
		{"duplicate past the scanned head", `{"model":"a","tools":` + pad + `,"model":"b"}`, "", ""},
		{"duplicate, same value", `{"model":"a","model":"a"}`, "", ""},
		{"case variant after", `{"model":"model-a","Model":"model-b"}`, "", ""},
		{"case variant alone", `{"MODEL":"model-b"}`, "", ""},
		{"case variant past the head", `{"model":"a","tools":` + pad + `,"mOdEl":"b"}`, "", ""},
		{"escape variant after", `{"model":"model-a","mod\u0065l":"model-b"}`, "", ""},
		{"escaped uppercase variant", `{"model":"a","\u004dodel":"b"}`, "", ""},
		{"escape alone is the model", `{"mod\u0065l":"k"}`, "", "k"},
		{"json/v2 nocase variant", `{"model":"a","mo_del":"b"}`, "", ""},
		{"nested model keys are not the model", `{"model":"a","metadata":{"model":"b","Model":"c"},"tools":[{"model":"d"}]}`, "", "a"},
		{"model in a string is not a key", `{"model":"a","prompt":"\",\"model\":\"b"}`, "", "a"},
		{"escaped quote before a late duplicate", `{"model":"a","tools":` + pad[:len(pad)-1] + `\\\"","model":"b"}`, "", ""},
		{"header and body agree", `{"model":"a"}`, "a", "a"},
		{"header and body disagree", `{"model":"model-b","messages":[]}`, "model-a", ""},
		{"header, body model past the head", `{"tools":` + pad + `,"model":"model-b"}`, "model-a", ""},
		{"header, body model agrees past the head", `{"tools":` + pad + `,"model":"model-a"}`, "model-a", "model-a"},
		{"header, body variant", `{"Model":"model-a"}`, "model-a", ""},
		{"header, body without a model", `{"messages":[]}`, "model-a", "model-a"},
		{"header, body model not a string", `{"tools":` + pad + `,"model":5}`, "model-a", ""},
		{"after the object is not the object", `{"model":"a"} {"model":"b"}`, "", "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []struct {
				name             string
				chunk, spill     int
				limit            int
				wantPromptCopied bool
			}{{"whole reads", 0, 0, 0, false}, {"small reads, spilling", 7, 4096, 100, false}, {"prompt hashed", 0, 0, 1024, false}} {
				model, sent, err := front([]byte(tc.body), tc.header, mode.limit, mode.chunk, mode.spill)
				if tc.model == "" {
					var ce *ConflictError
					if err == nil || !errors.As(err, &ce) && !errors.Is(err, ErrModelNotString) {
						t.Fatalf("%s: routed %q (err %v), want a conflict", mode.name, model, err)
					}
					if bytes.Equal(sent, []byte(tc.body)) {
						t.Fatalf("%s: refused, yet the whole body went on", mode.name)
					}
					continue
				}
				if err != nil || model != tc.model {
					t.Fatalf("%s: routed %q, err %v; want %q", mode.name, model, err, tc.model)
				}
				if !bytes.Equal(sent, []byte(tc.body)) {
					t.Fatalf("%s: sent %d bytes, not the body's %d", mode.name, len(sent), len(tc.body))
				}
			}
		})
	}
}

// TestScanSpill: with Spill, a body whose model comes last is held once, in
// the spilled pieces and a buffer that stays small, and the prompt's head
// survives being spilled.
func TestScanSpill(t *testing.T) {
	prompt := `[{"role":"user","content":"` + strings.Repeat("hello ", 1<<20) + `"}]`
	body := `{"messages":` + prompt + `,"stream":true,"model":"m"}`
	var spilled bytes.Buffer
	var head bytes.Buffer
	maxBuf := 0
	sc, err := ScanFor(iotest.HalfReader(strings.NewReader(body)), &head, Want{PromptLimit: 4096, Spill: func(p []byte) error {
		maxBuf = max(maxBuf, head.Cap())
		spilled.Write(p)
		return nil
	}})
	if err != nil || sc.Model != "m" || string(sc.Prompt) != prompt[:4096] {
		t.Fatalf("model %q prompt %.30q err %v", sc.Model, sc.Prompt, err)
	}
	if spilled.String()+head.String() != body {
		t.Fatal("spilled + buffer is not the body")
	}
	if maxBuf > 4*spillAt {
		t.Errorf("the buffer grew to %d bytes, want it near %d", maxBuf, spillAt)
	}
	// A Spill that refuses ends the scan with its error.
	stop := errors.New("over budget")
	head.Reset()
	if _, err := ScanFor(strings.NewReader(body), &head, Want{Spill: func([]byte) error { return stop }}); !errors.Is(err, stop) {
		t.Fatalf("err %v, want the Spill's", err)
	}
}

// FuzzModelScan: whenever kvgate routes a body (the scan and its Guard over
// the rest accept it), the upstream's decoder reads the model it routed by:
// Go's encoding/json into a struct (last key, any case) and into a map (last
// exact key, as Python's json does), and a streaming json.Decoder.
func FuzzModelScan(f *testing.F) {
	for _, s := range []string{
		`{"model":"m"}`, `{"model":"model-a","model":"model-b","messages":[]}`, `{"model":"model-a","Model":"model-b"}`,
		`{"model":"model-a","mod\u0065l":"model-b"}`, `{"MODEL":"x"}`, `{"model":"a","\u212aey":1}`, `{"mod\u0065l":"k"}`,
		`{"messages":[{"content":"x"}],"model":"y"}`, `{"a":{"model":"n"},"model":"o"}`, `{"model":"a","prompt":"\",\"model\":\"b"}`,
		`{"model":"a","x":"\\","model":"b"}`, `{"model":"a"} {"model":"b"}`, `{"model":"a","x":[1,{"model":2}],"MoDeL":"b"}`,
		`{"model":"h","messages":[]}`, `{"model":"b"}`, `{"model":1}`, `{"model":"\ud800"}`, `  {"model" : "s" }  `, `[]`, `{`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(0x85))
	}
	f.Fuzz(func(t *testing.T, body []byte, mode uint8) {
		header := ""
		if mode&1 != 0 {
			header = "h"
		}
		chunk := int(mode>>1&7) + 1
		spill := 0
		if mode&0x80 != 0 {
			spill = 8
		}
		model, sent, err := front(body, header, int(mode>>4&7)*3, chunk, spill)
		var syntax *SyntaxError
		if errors.As(err, &syntax) && json.Valid(body) {
			// Refusing unreadable bodies is safe only if the scan never
			// calls a valid one unreadable.
			t.Fatalf("valid JSON refused as malformed: %v", err)
		}
		if err != nil {
			return
		}
		if !bytes.Equal(sent, body) {
			t.Fatal("routed, but what went on is not the body")
		}
		var st struct {
			Model *string `json:"model"`
		}
		if json.Unmarshal(body, &st) == nil && st.Model != nil && *st.Model != model {
			t.Fatalf("routed %q, encoding/json reads %q", model, *st.Model)
		}
		var m map[string]any
		if json.Unmarshal(body, &m) == nil {
			if v, ok := m["model"]; ok && v != model {
				t.Fatalf("routed %q, the last exact key is %v", model, v)
			}
		}
		st.Model = nil
		if json.NewDecoder(bytes.NewReader(body)).Decode(&st) == nil && st.Model != nil && *st.Model != model {
			t.Fatalf("routed %q, json.Decoder reads %q", model, *st.Model)
		}
	})
}

// BenchmarkGuard256KB checks the rest of a 256 KB chat body streaming past a
// scan that stopped at a leading model: the cost every such body now pays.
func BenchmarkGuard256KB(b *testing.B) {
	var content strings.Builder
	for content.Len() < 256<<10 {
		content.WriteString("The committee reviewed every clause of the agreement in detail. ")
	}
	rest := []byte(`,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + content.String() + `"}],"max_tokens":1,"stream":true,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`)
	b.SetBytes(int64(len(rest)))
	for b.Loop() {
		g := &Guard{state: gAfter, seen: true, expect: "m", depth: 1}
		if err := g.Check(rest); err != nil || g.state != gDone {
			b.Fatal(err, g.state)
		}
	}
}

// TestScanBody: a body held whole is read by the same rules as one that
// streams, to its end.
func TestScanBody(t *testing.T) {
	pad := `"` + strings.Repeat("p", 2<<20) + `"` // past promptSearch: the scan stops before what follows
	for _, tc := range []struct {
		name, body, header string
		model              string
		found              bool   // the body named a model
		err                string // "": none
	}{
		{"model", `{"model":"a","messages":[]}`, "", "a", true, ""},
		{"no model", `{"messages":[]}`, "", "", false, ""},
		{"header alone", `{"messages":[]}`, "h", "h", false, ""},
		{"header and the same model", `{"messages":[],"model":"h"}`, "h", "h", false, ""},
		{"header and another model", `{"model":"b"}`, "h", "", false, `the x-gateway-model-name header names model "h" but the body names "b"`},
		{"case variant before the model", `{"MODEL":"a","model":"b"}`, "", "", false, `spelled "model", not "MODEL"`},
		{"case variant after the model", `{"model":"b","Model":"a"}`, "", "", false, "more than once"},
		{"duplicate", `{"model":"a","model":"b"}`, "", "", false, "more than once"},
		{"duplicate past the scan", `{"model":"a","x":` + pad + `,"model":"b"}`, "", "", false, "more than once"},
		{"duplicate under the header", `{"model":"h","model":"h"}`, "h", "", false, "more than once"},
		{"not a string", `{"model":7}`, "", "", false, ErrModelNotString.Error()},
		{"not a string under the header", `{"model":7}`, "h", "", false, ErrModelNotString.Error()},
		{"not an object", `[1]`, "", "", false, ErrNotObject.Error()},
		{"not JSON past the scan", `{"model":"a","x":` + pad + `,"y":NaN}`, "", "", false, "malformed JSON body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := ScanBody([]byte(tc.body), Want{HeaderModel: tc.header})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil || sc.Model != tc.model || sc.ModelFound != tc.found {
				t.Fatalf("model %q found %v, error %v; want %q found %v", sc.Model, sc.ModelFound, err, tc.model, tc.found)
			}
		})
	}
}
