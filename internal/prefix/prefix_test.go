package prefix

import (
	"strings"
	"testing"
)

func TestHashes(t *testing.T) {
	shared := strings.Repeat("You are a helpful assistant. ", 20) // 580 chars: 9 blocks
	a := Hashes(shared+"Question one?", 64, 256, Seed("m", ""))
	b := Hashes(shared+"A different question entirely, much longer than the first one.", 64, 256, Seed("m", ""))
	for _, tc := range []struct {
		name string
		got  int
		want int
	}{
		{"full blocks only", len(Hashes(strings.Repeat("x", 127), 64, 256, 1)), 1},
		{"empty", len(Hashes("", 64, 256, 1)), 0},
		{"max blocks", len(Hashes(strings.Repeat("x", 64*300), 64, 256, 1)), 256},
		{"shared prefix blocks agree", commonPrefix(a, b), 9},
		{"another adapter shares nothing", commonPrefix(a, Hashes(shared, 64, 256, Seed("m", "lora"))), 0},
		{"a change early changes every later block", commonPrefix(a, Hashes("X"+shared[1:], 64, 256, Seed("m", ""))), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %d, want %d", tc.got, tc.want)
			}
		})
	}
}

func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestIndex(t *testing.T) {
	x := New()
	doc := Hashes(strings.Repeat("policy text ", 100), 64, 256, Seed("m", ""))
	if x.Match("a", doc) != 0 {
		t.Fatal("empty index matched")
	}
	x.Record("a", doc[:10], 0)
	for _, tc := range []struct {
		name string
		addr string
		want int
	}{
		{"recorded prefix", "a", 10},
		{"other endpoint", "b", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := x.Match(tc.addr, doc); got != tc.want {
				t.Fatalf("match %d, want %d", got, tc.want)
			}
		})
	}
	// A capacity of 4 blocks keeps only the most recent 4: the prefix's head is gone.
	x.Record("small", doc[:10], 4)
	if got := x.Match("small", doc); got != 0 || x.Entries() != 14 {
		t.Fatalf("small endpoint matched %d, entries %d", got, x.Entries())
	}
	x.Record("small", doc[:3], 4)
	if got := x.Match("small", doc); got != 3 {
		t.Fatalf("after re-recording the head: %d", got)
	}
	x.Forget("a")
	if x.Match("a", doc) != 0 {
		t.Fatal("forgotten endpoint still matches")
	}
}

func BenchmarkHashes16KB(b *testing.B) {
	text := strings.Repeat("The committee reviewed every clause of the agreement. ", 400)[:16384]
	seed := Seed("m", "")
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Hashes(text, 64, 256, seed)
	}
}
