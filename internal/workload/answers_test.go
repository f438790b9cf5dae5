package workload

import (
	"slices"
	"testing"
)

// TestAnswers: in a multi-turn trace every turn but a session's last has the
// answer its next turn quotes, and the blocks of prompt + answer lead the next
// turn's prompt blocks; other kinds have none.
func TestAnswers(t *testing.T) {
	tr := generate(t, Spec{Kind: MultiTurn, Seed: 9, Sessions: 20, Turns: 4})
	answers := tr.Answers()
	next := map[string]int{}
	for i := len(tr) - 1; i >= 0; i-- {
		r, a := tr[i], answers[i]
		j, later := next[r.Session]
		next[r.Session] = i
		if !later {
			if a != (Segment{}) {
				t.Errorf("request %d, a session's last turn, has answer %+v", i, a)
			}
			continue
		}
		if a.Tokens != r.OutputTokens || a.ID == "" {
			t.Fatalf("request %d: answer %+v for %d output tokens", i, a, r.OutputTokens)
		}
		seq := BlockIDs(nil, append(slices.Clone(r.Prompt), a), 16)
		if follow := BlockIDs(nil, tr[j].Prompt, 16); !slices.Equal(seq, follow[:len(seq)]) {
			t.Fatalf("request %d: prompt + answer blocks are not the head of turn %d's", i, j)
		}
	}
	for _, kind := range []string{Poisson, SharedPrefix} {
		for i, a := range generate(t, Spec{Kind: kind, Seed: 9, Requests: 300}).Answers() {
			if a != (Segment{}) {
				t.Fatalf("%s request %d has answer %+v", kind, i, a)
			}
		}
	}
}
