package proxy

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReplayParts: a head held in pieces is sent in order, then the rest; the
// recording for a retry reserves from the budget as it grows, stops (the body
// is then not replayed) when the budget cannot spare more, and everything is
// given back when the request is done.
func TestReplayParts(t *testing.T) {
	head := [][]byte{[]byte("ab"), {}, []byte("cde"), []byte("f")}
	rest := strings.Repeat("r", 100<<10)
	for _, tc := range []struct {
		name     string
		limit    int64 // the budget across requests
		restSize int64
		replay   bool
	}{
		{"within the budget, length known", 1 << 20, int64(len(rest)), true},
		{"within the budget, length unknown", 1 << 20, -1, true},
		{"over the budget", 64 << 10, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var budget Budget
			var seen int64
			budget.OnChange = func(used, _ int64) { seen = max(seen, used) }
			hold := budget.Hold(tc.limit)
			b := NewReplayParts(head, iotest.HalfReader(strings.NewReader(rest)), 1<<20)
			b.SetHold(hold, tc.restSize)
			for attempt := range 2 {
				rc, ok := b.Next()
				if !ok {
					if tc.replay || attempt == 0 {
						t.Fatalf("attempt %d could not start", attempt)
					}
					break
				}
				got, err := io.ReadAll(rc)
				if err != nil || string(got) != "abcdef"+rest {
					t.Fatalf("attempt %d sent %d bytes (%v), want the head's pieces then the rest", attempt, len(got), err)
				}
				if attempt == 0 && b.CanReplay() != tc.replay {
					t.Fatalf("replayable %v, want %v", !tc.replay, tc.replay)
				}
			}
			if seen > tc.limit {
				t.Errorf("reserved %d bytes past the budget's %d", seen, tc.limit)
			}
			hold.Done()
			if budget.Used() != 0 {
				t.Errorf("%d bytes still reserved after Done", budget.Used())
			}
		})
	}
}

// TestBudgetAcrossHolds: holds share one budget; a reservation that would pass
// it takes nothing.
func TestBudgetAcrossHolds(t *testing.T) {
	var b Budget
	h1, h2 := b.Hold(100), b.Hold(100)
	for _, step := range []struct {
		h    *Hold
		n    int64
		ok   bool
		used int64
	}{{h1, 60, true, 60}, {h2, 50, false, 60}, {h2, 40, true, 100}, {h1, 1, false, 100}} {
		if ok := step.h.Reserve(step.n); ok != step.ok || b.Used() != step.used {
			t.Fatalf("reserve %d: %v, used %d; want %v, %d", step.n, ok, b.Used(), step.ok, step.used)
		}
	}
	h1.Done()
	h1.Done()
	if b.Used() != 40 {
		t.Fatalf("used %d after one hold is done, want 40", b.Used())
	}
}
