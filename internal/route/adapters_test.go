package route

import "testing"

func TestRecentAdapters(t *testing.T) {
	tests := []struct {
		name    string
		sent    []string
		adapter string
		slots   int
		held    bool
		used    int
	}{
		{name: "nothing sent", adapter: "a", slots: 4},
		{name: "sent", sent: []string{"a"}, adapter: "a", slots: 4, held: true, used: 1},
		{name: "base model", sent: []string{"a"}, adapter: "", slots: 4, used: 1},
		{name: "evicted by newer ones", sent: []string{"a", "b", "c", "d", "e"}, adapter: "a", slots: 4, used: 4},
		{name: "sent again moves to the front", sent: []string{"a", "b", "c", "d", "a", "e"}, adapter: "a", slots: 4, held: true, used: 4},
		{name: "repeats count once", sent: []string{"a", "b", "b", "b", "b"}, adapter: "a", slots: 2, held: true, used: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r recentAdapters
			for _, a := range tc.sent {
				r.sent(a)
			}
			held, used := r.held(tc.adapter, tc.slots)
			if held != tc.held || used != tc.used {
				t.Errorf("held(%q, %d) = %v, %d; want %v, %d", tc.adapter, tc.slots, held, used, tc.held, tc.used)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		var r recentAdapters
		for i := range 3 * maxRecentAdapters {
			r.sent(string(rune('A' + i)))
		}
		if len(r.list) != maxRecentAdapters {
			t.Errorf("kept %d adapters, want %d", len(r.list), maxRecentAdapters)
		}
	})
}
