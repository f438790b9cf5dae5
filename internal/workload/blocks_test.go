package workload

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

func commonPrefix[T comparable](a, b []T) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func blocks(p ...Segment) []uint64 { return BlockIDs(nil, p, 16) }

func TestBlockIDs(t *testing.T) {
	a20, b12, b40 := Segment{"a", 20}, Segment{"b", 12}, Segment{"b", 40}
	for _, tc := range []struct {
		name      string
		got, want int
	}{
		{"boundary independent", commonPrefix(blocks(a20, b12), blocks(a20, b40)), 2},
		{"longer segment of the same id", commonPrefix(blocks(Segment{"a", 32}), blocks(Segment{"a", 64})), 2},
		{"another id shares nothing", commonPrefix(blocks(Segment{"a", 64}), blocks(Segment{"c", 64})), 0},
		{"a later segment changes later blocks", commonPrefix(blocks(a20, b12), blocks(a20, Segment{"c", 12})), 1},
		{"partial block dropped", len(blocks(Segment{"a", 47})), 2},
		{"short prompt", len(blocks(Segment{"a", 15})), 0},
		{"blocks across segments", len(blocks(Segment{"a", 10}, Segment{"b", 10}, Segment{"c", 12})), 2},
		// Not chained: a repeated run repeats its block, and chaining is the caller's.
		{"not chained", commonPrefix(blocks(Segment{"a", 16}, Segment{"a", 16})[1:], blocks(Segment{"a", 16})), 1},
		{"no block size", len(BlockIDs(nil, []Segment{{"a", 64}}, 0)), 0},
		{"appends to dst", len(BlockIDs(make([]uint64, 3), []Segment{{"a", 64}}, 16)), 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %d, want %d", tc.got, tc.want)
			}
		})
	}
}

// TestBlockIDsDefinition checks the staged hashing against the definition, for
// block sizes below, at and above the staging buffer.
func TestBlockIDsDefinition(t *testing.T) {
	prompt := []Segment{{"g-1", 300}, {"s-1/a0", 7}, {"u-9", 150}}
	var tokens []byte
	for _, s := range prompt {
		for i := range s.Tokens {
			tokens = binary.LittleEndian.AppendUint64(tokens, mix(xxhash.Sum64String(s.ID), i))
		}
	}
	for _, n := range []int{1, 16, 31, 32, 33, 64, 100, 457, 458} {
		var want []uint64
		for i := 0; (i+1)*n*8 <= len(tokens); i++ {
			want = append(want, xxhash.Sum64(tokens[i*n*8:(i+1)*n*8]))
		}
		if got := BlockIDs(nil, prompt, n); !slices.Equal(got, want) {
			t.Errorf("blocks of %d: %d ids, want %d, first difference at %d", n, len(got), len(want), commonPrefix(got, want))
		}
	}
}

func TestBlockIDsAllocs(t *testing.T) {
	prompt := []Segment{{"g-1", 2048}, {"u-1", 1000}}
	dst := make([]uint64, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = BlockIDs(dst[:0], prompt, 16) }); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
}

func BenchmarkBlockIDs32k(b *testing.B) {
	prompt := []Segment{{"g-1", 2048}, {"s-1/a0", 512}, {"u-1", 32768 - 2048 - 512}}
	dst := make([]uint64, 0, 2048)
	b.SetBytes(32768)
	for b.Loop() {
		dst = BlockIDs(dst[:0], prompt, 16)
	}
}

func TestText(t *testing.T) {
	sys := Segment{"g-1", 200}
	one, two := Text([]Segment{sys, {"u-1", 50}}), Text([]Segment{sys, {"u-2", 50}})
	head := Text([]Segment{sys})
	thousand := Text([]Segment{{"u-3", 1000}})
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"deterministic", one == Text([]Segment{sys, {"u-1", 50}})},
		{"shared segment, shared prefix", strings.HasPrefix(one, head+" ") && strings.HasPrefix(two, head+" ")},
		{"different segments differ", one != two && commonPrefix([]byte(one), []byte(two)) < len(head)+10},
		{"a longer segment extends a shorter one", strings.HasPrefix(Text([]Segment{{"g-1", 400}}), head)},
		{"about 4 characters per token", len(thousand) >= 3000 && len(thousand) <= 5000},
		{"about as many tokens for kvgate's tokenizer", tokenizer.Count(thousand) >= 750 && tokenizer.Count(thousand) <= 1250},
		{"segments are not shifted copies of each other", sharedRuns(thousand, Text([]Segment{{"u-4", 1000}})) < 5},
		{"empty", Text(nil) == "" && Text([]Segment{{"a", 0}}) == ""},
		{"starts a sentence", thousand[0] >= 'A' && thousand[0] <= 'Z'},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.ok {
				t.Fatalf("failed; texts %.80q…, %.80q…", one, two)
			}
		})
	}
}

// sharedRuns counts the runs of four words that two texts have in common.
func sharedRuns(a, b string) int {
	runs := func(s string) map[string]bool {
		w := strings.Fields(strings.ToLower(strings.NewReplacer(".", "", ",", "").Replace(s)))
		m := map[string]bool{}
		for i := range len(w) - 3 {
			m[strings.Join(w[i:i+4], " ")] = true
		}
		return m
	}
	ra, n := runs(a), 0
	for r := range runs(b) {
		if ra[r] {
			n++
		}
	}
	return n
}

func TestVocab(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range vocab {
		if seen[w] || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("word %q repeated or not lower-case ASCII", w)
		}
		seen[w] = true
	}
	if len(vocab) != 512 {
		t.Errorf("%d words", len(vocab))
	}
}
