// Package tokenizer is the deterministic stand-in tokenizer kvgate's simulator and
// benchmarks share. It is not a BPE: it only has to count tokens the way a real
// tokenizer roughly does (about four characters per token on English text), give the
// same ids for the same text every time, and be cheap enough for 200 KB prompts.
//
// Rules, applied left to right:
//   - a special token written <|name|> (letters, digits and '_' inside) is one token;
//   - a word, meaning a run of ASCII letters and digits with at most one space before
//     it, is cut into pieces of at most six bytes (the space counts), so common short
//     words are one token and long ones several, as with a real vocabulary;
//   - a run of one whitespace byte is cut into pieces of at most six;
//   - any other ASCII byte (punctuation) is one token, and so is every non-ASCII rune.
//
// A token's id is the 32-bit FNV-1a hash of its text with the top bit clear, or set
// for special tokens.
package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// maxPiece is the longest piece a word or whitespace run is cut into; six gives
// about four characters per token on English prose (TestAboutFourCharactersPerToken).
const maxPiece = 6

const specialBit = 1 << 31

// Encode appends the token ids of text to dst and returns the extended slice.
func Encode(dst []uint32, text string) []uint32 {
	scan(text, func(piece string, special bool) {
		dst = append(dst, id(piece, special))
	})
	return dst
}

// Count returns the number of tokens in text.
func Count(text string) int {
	n := 0
	scan(text, func(string, bool) { n++ })
	return n
}

// Split returns the pieces of text, one per token; for tests and explanations.
func Split(text string) []string {
	var out []string
	scan(text, func(piece string, _ bool) { out = append(out, piece) })
	return out
}

func scan(text string, emit func(piece string, special bool)) {
	i := 0
	for i < len(text) {
		c := text[i]
		switch {
		case c == '<' && strings.HasPrefix(text[i:], "<|"):
			if n := specialLen(text[i:]); n > 0 {
				emit(text[i:i+n], true)
				i += n
				continue
			}
			emit(text[i:i+1], false)
			i++
		case c >= utf8.RuneSelf:
			_, n := utf8.DecodeRuneInString(text[i:])
			emit(text[i:i+n], false)
			i += n
		case isWordByte(c) || startsWord(text, i):
			j := i + 1
			for j < len(text) && isWordByte(text[j]) {
				j++
			}
			for k := i; k < j; k += maxPiece {
				emit(text[k:min(k+maxPiece, j)], false)
			}
			i = j
		case c == ' ' || c == '\n' || c == '\t' || c == '\r':
			j := i + 1
			// A space directly before a word belongs to that word.
			for j < len(text) && j-i < maxPiece && text[j] == c && !startsWord(text, j) {
				j++
			}
			emit(text[i:j], false)
			i = j
		default:
			emit(text[i:i+1], false)
			i++
		}
	}
}

func id(piece string, special bool) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(piece); i++ {
		h ^= uint32(piece[i])
		h *= 16777619
	}
	if special {
		return h | specialBit
	}
	return h &^ specialBit
}

// specialLen returns the length of a special token at the start of s, or 0.
func specialLen(s string) int {
	for j := 2; j < len(s) && j < 64; j++ {
		c := s[j]
		if c == '|' {
			if j+1 < len(s) && s[j+1] == '>' && j > 2 {
				return j + 2
			}
			return 0
		}
		if !isWordByte(c) && c != '_' {
			return 0
		}
	}
	return 0
}

func startsWord(text string, j int) bool {
	return text[j] == ' ' && j+1 < len(text) && isWordByte(text[j+1])
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
