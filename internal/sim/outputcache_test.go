package sim

import (
	"slices"
	"testing"
)

// TestOutputBlocksAreCached: as in vLLM V1, every block a sequence fills becomes
// cacheable, those of its output too, under identities chained from its
// prompt's; a follow-up whose prompt quotes prompt and answer hits them.
func TestOutputBlocksAreCached(t *testing.T) {
	const bs = DefaultBlockSize
	for _, tc := range []struct {
		name           string
		prompt, output int
		wantCached     int // tokens of the first turn's context in the cache afterwards
	}{
		// 40 + 60 = 100 tokens: 6 full blocks, all computed (the last token's KV
		// is never computed, but it lies in the partial 7th block).
		{"partial last block", 40, 60, 96},
		// 40 + 56 = 96 tokens: 6 full blocks, the 6th lacks its last token's KV.
		{"block-aligned end", 40, 56, 80},
		// The output fills blocks of its own beyond a block-aligned prompt.
		{"aligned prompt", 32, 40, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustEngine(t, h100)
			first := mustSubmit(t, e, Request{PromptTokens: tc.prompt, BlockHashes: hashes(1, tc.prompt), OutputTokens: tc.output, MaxTokens: tc.output})
			drain(t, e)
			ctx := e.SeqBlockHashes(first, nil)
			if want := (tc.prompt + tc.output) / bs; len(ctx) != want {
				t.Fatalf("%d context block hashes, want %d", len(ctx), want)
			}
			if !slices.Equal(ctx[:tc.prompt/bs], hashes(1, tc.prompt)) {
				t.Fatal("context hashes do not start with the prompt's")
			}
			if got := e.CachedPrefixTokens(ctx); got != tc.wantCached {
				t.Fatalf("%d tokens of the first turn cached, want %d", got, tc.wantCached)
			}
			// The next turn: the whole first turn, then 50 tokens of its own.
			n := tc.prompt + tc.output + 50
			next := append(slices.Clone(ctx), hashes(2, n)[len(ctx):]...)
			s := mustSubmit(t, e, Request{PromptTokens: n, BlockHashes: next, MaxTokens: 1})
			drain(t, e)
			if s.CachedTokens != tc.wantCached {
				t.Errorf("follow-up hit %d tokens, want %d", s.CachedTokens, tc.wantCached)
			}
			checkInvariants(t, e)
		})
	}
}

// TestGivenOutputBlockHashes: hashes past the prompt's name the output's blocks
// (a replayed conversation whose next turn quotes the answer), so the next turn,
// hashed by the workload alone, hits them.
func TestGivenOutputBlockHashes(t *testing.T) {
	e := mustEngine(t, h100)
	conv := hashes(3, 400) // 25 blocks: prompt 100 tokens, answer 150, next user 150
	first := mustSubmit(t, e, Request{PromptTokens: 100, BlockHashes: conv[:250/DefaultBlockSize], OutputTokens: 150, MaxTokens: 150})
	drain(t, e)
	if got := e.SeqBlockHashes(first, nil); !slices.Equal(got, conv[:250/DefaultBlockSize]) {
		t.Fatalf("context hashes %x, want the given ones", got)
	}
	next := mustSubmit(t, e, Request{PromptTokens: 400, BlockHashes: conv, MaxTokens: 1})
	drain(t, e)
	if want := 240; next.CachedTokens != want {
		t.Errorf("next turn hit %d tokens, want %d (the first turn's 15 full blocks)", next.CachedTokens, want)
	}
}

// TestOutputBlocksNeedNamedPrompt: a request without identities for its prompt
// caches nothing, output included; output blocks are distinct per sequence, so
// two identical prompts never share what they generate.
func TestOutputBlocksNeedNamedPrompt(t *testing.T) {
	e := mustEngine(t, h100)
	anon := mustSubmit(t, e, Request{PromptTokens: 100, OutputTokens: 100, MaxTokens: 100})
	a := mustSubmit(t, e, Request{PromptTokens: 100, BlockHashes: hashes(4, 100), OutputTokens: 100, MaxTokens: 100})
	b := mustSubmit(t, e, Request{PromptTokens: 100, BlockHashes: hashes(4, 100), OutputTokens: 100, MaxTokens: 100})
	drain(t, e)
	if h := e.SeqBlockHashes(anon, nil); len(h) != 0 {
		t.Errorf("anonymous prompt has %d context hashes", len(h))
	}
	if e.kv.evictable != 18 {
		t.Errorf("%d blocks cached, want 18: 6 shared prompt blocks and 6 output blocks of each named sequence", e.kv.evictable)
	}
	ha, hb := e.SeqBlockHashes(a, nil), e.SeqBlockHashes(b, nil)
	if !slices.Equal(ha[:6], hb[:6]) || ha[6] == hb[6] {
		t.Errorf("named sequences: prompt hashes equal %v, first output hashes differ %v", slices.Equal(ha[:6], hb[:6]), ha[6] != hb[6])
	}
}

// TestDisabledPrefixCachingCachesNoOutput: with prefix caching off no block is
// registered, output blocks included.
func TestDisabledPrefixCachingCachesNoOutput(t *testing.T) {
	cfg := h100
	cfg.DisablePrefixCaching = true
	e := mustEngine(t, cfg)
	s := mustSubmit(t, e, Request{PromptTokens: 100, BlockHashes: hashes(5, 100), OutputTokens: 100, MaxTokens: 100})
	drain(t, e)
	if n := e.CachedPrefixTokens(e.SeqBlockHashes(s, nil)); n != 0 || e.kv.evictable != 0 {
		t.Errorf("%d tokens cached, %d blocks evictable with prefix caching off", n, e.kv.evictable)
	}
}
