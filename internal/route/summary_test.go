package route

import (
	"testing"
	"time"
)

// TestRecentWindow: old buckets leave the window, and the quantile comes from
// the bins within 25%.
func TestRecentWindow(t *testing.T) {
	var r recent
	t0 := time.Unix(1_000_000, 0)
	for i := range 100 {
		r.ttft(t0, time.Duration(i+1)*time.Millisecond*10) // 10 ms .. 1 s
		r.result(t0, "200")
	}
	r.result(t0, "502")
	r.result(t0, "429")
	w := r.read(t0.Add(time.Second))
	if w.total != 102 || w.errors != 1 || w.shed != 1 || w.ttftCount != 100 {
		t.Fatalf("window %+v", w)
	}
	if p95 := w.ttftQuantile(0.95); p95 < 0.95 || p95 > 0.95*1.25 {
		t.Errorf("p95 %.3f s, want about 0.95", p95)
	}
	if later := r.read(t0.Add(recentWindow + recentBucket)); later.total != 0 || later.ttftCount != 0 {
		t.Errorf("after the window: %+v", later)
	}
}
