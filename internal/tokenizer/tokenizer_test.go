package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

const english = `The quick brown fox jumps over the lazy dog. Continuous batching lets an inference
server admit new requests at every iteration instead of waiting for a whole batch to finish,
which keeps the accelerator busy and cuts the time to first token for requests that arrive
while others are still decoding. Prefix caching reuses the key and value tensors of prompt
blocks that earlier requests already computed, so a shared system prompt is prefilled once.`

func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"", nil},
		{"Hello world", []string{"Hello", " world"}},
		{"internationalization", []string{"intern", "ationa", "lizati", "on"}},
		{"a, b.", []string{"a", ",", " b", "."}},
		{"x  y", []string{"x", " ", " y"}},
		{"\n\n\n\n\n\n\n", []string{"\n\n\n\n\n\n", "\n"}},
		{"<|eot_id|>hi", []string{"<|eot_id|>", "hi"}},
		{"<|not special", []string{"<", "|", "not", " speci", "al"}},
		{"héllo", []string{"h", "é", "llo"}},
		{"日本", []string{"日", "本"}},
	} {
		t.Run(tc.text, func(t *testing.T) {
			ids := Encode(nil, tc.text)
			got := Split(tc.text)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("pieces %q, want %q", got, tc.want)
			}
			if n := Count(tc.text); n != len(ids) {
				t.Errorf("Count = %d, Encode gave %d", n, len(ids))
			}
		})
	}
}

func TestPiecesCoverText(t *testing.T) {
	for _, text := range []string{english, "tabs\t\tand  spaces   here\r\n", "ünïcödé — dashes", "1234567890 numbers 3.14"} {
		if got := strings.Join(Split(text), ""); got != text {
			t.Errorf("pieces of %q join to %q", text, got)
		}
	}
}

func TestAboutFourCharactersPerToken(t *testing.T) {
	n := Count(english)
	ratio := float64(len(english)) / float64(n)
	if ratio < 3.5 || ratio > 4.5 {
		t.Fatalf("%.2f characters per token on English text, want about 4", ratio)
	}
}

func TestDeterministic(t *testing.T) {
	if !slices.Equal(Encode(nil, english), Encode(nil, english)) {
		t.Fatal("same text, different ids")
	}
	if Encode(nil, "<|eot_id|>")[0]>>31 != 1 || Encode(nil, "eot")[0]>>31 != 0 {
		t.Fatal("special and ordinary ids share a space")
	}
	if slices.Equal(Encode(nil, "alpha beta"), Encode(nil, "alpha beat")) {
		t.Fatal("different text, same ids")
	}
}

func BenchmarkCount220KB(b *testing.B) {
	text := strings.Repeat(english+"\n", 550)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Count(text)
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{english, "", "<|eot_id|>", "<|", "a<|b|>c", "\xff\xfe", "  \n\n\t\t  x", "日本語テキスト"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		pieces := Split(text)
		if strings.Join(pieces, "") != text {
			t.Fatalf("pieces of %q do not join back", text)
		}
		for _, p := range pieces {
			if p == "" {
				t.Fatalf("empty piece in %q", text)
			}
		}
		if Count(text) != len(pieces) || len(Encode(nil, text)) != len(pieces) {
			t.Fatalf("Count, Encode and Split disagree on %q", text)
		}
	})
}
