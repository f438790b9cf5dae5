package route

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/schedule"
)

func candidates(n int) []schedule.Candidate {
	out := make([]schedule.Candidate, n)
	for i := range out {
		out[i] = schedule.Candidate{Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Score: 1 - float64(i)/100}
	}
	return out
}

// TestDecisionLog: the log keeps one decision per decisionEvery, newest first,
// at most decisionLogSize of them and decisionCandidates candidates each.
func TestDecisionLog(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name      string
		n         int           // decisions offered
		gap       time.Duration // between two
		cands     int
		wantKept  int
		wantCands int
	}{
		{"each kept when apart", 5, decisionEvery, 3, 5, 3},
		{"one kept of a burst", 10, time.Millisecond, 3, 1, 3},
		{"sampled at the interval", 20, decisionEvery / 4, 1, 5, 1},
		{"ring bounded", decisionLogSize + 7, decisionEvery, 1, decisionLogSize, 1},
		{"candidates bounded", 1, 0, 64, 1, decisionCandidates},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l decisionLog
			for i := range tc.n {
				l.keep(t0.Add(time.Duration(i)*tc.gap), fmt.Sprint("r", i), llama, "10.0.0.1:8000", tc.cands, candidates(tc.cands))
			}
			got := l.views()
			if len(got) != tc.wantKept {
				t.Fatalf("kept %d, want %d", len(got), tc.wantKept)
			}
			if !slices.IsSortedFunc(got, func(a, b DecisionView) int { return b.Time.Compare(a.Time) }) {
				t.Errorf("not newest first: %v", got)
			}
			newest := got[0]
			if want := fmt.Sprint("r", tc.n-1); tc.gap >= decisionEvery && newest.RequestID != want {
				t.Errorf("newest %s, want %s", newest.RequestID, want)
			}
			if len(newest.Candidates) != tc.wantCands || newest.Considered != tc.cands || newest.Winner != "10.0.0.1:8000" {
				t.Errorf("newest %+v", newest)
			}
		})
	}
}

// TestDecisionLogScores: a kept decision shows each candidate's per-scorer
// scores, and keeping more decisions into reused slots does not change the
// ones already rendered.
func TestDecisionLogScores(t *testing.T) {
	p := decisionPicker(t)
	t0 := time.Unix(1_000_000, 0)
	var l decisionLog
	busy := schedule.Signals{Healthy: true, HasMetrics: true}
	busy.Waiting = 8
	eps := []schedule.Endpoint{{Address: "b:1", Signals: busy}, {Address: "a:1", Signals: schedule.Signals{Healthy: true, HasMetrics: true}}}
	d := p.Pick(schedule.Request{Model: llama}, eps)
	l.keep(t0, "r1", llama, d.Ranked[0].Address, len(eps), d.Ranked)
	got := l.views()
	if len(got) != 1 || len(got[0].Candidates) == 0 || got[0].Winner != "a:1" {
		t.Fatalf("views %+v", got)
	}
	// The idle endpoint leads, with the queue scorer's full marks.
	best := got[0].Candidates[0]
	if q, ok := best.Scores["queue"]; best.Address != "a:1" || !ok || q != 1 || best.Score <= 0 {
		t.Errorf("best candidate %+v: want a:1 with its scores", best)
	}
	for i := range decisionLogSize {
		l.keep(t0.Add(time.Duration(i+1)*decisionEvery), "later", llama, "b:1", 1, candidates(1))
	}
	if got[0].Candidates[0].Address != "a:1" {
		t.Errorf("a rendered view changed with the ring: %+v", got[0])
	}
}

func decisionPicker(t *testing.T) schedule.Picker {
	t.Helper()
	p, err := newPicker(schedulerSpec("p", llama), nil, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEndpointMinute: an endpoint's minute places each second's TTFT at its
// point of the series, reads the rate over the window's own span while it is
// younger than a minute, and forgets what is older than a minute.
func TestEndpointMinute(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var e endpoint
	for s := range 10 {
		at := t0.Add(time.Duration(s) * time.Second)
		for range 3 {
			e.countMinute(at)
			e.ttftMinute(at, time.Duration(s+1)*100*time.Millisecond)
		}
	}
	for _, tc := range []struct {
		name         string
		at           time.Duration // after t0
		wantRequests int
		wantRate     float64
		wantLastP50  float64 // the point of t0+9s, when inside the series
		lastIndex    int
	}{
		{"young window", 9 * time.Second, 30, 3, 1.0, minuteBuckets - 1},
		{"a minute in", 59 * time.Second, 30, 0.5, 1.0, 9},
		{"past the minute", 70 * time.Second, 0, 0, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := e.minuteView(t0.Add(tc.at))
			if v.Requests != tc.wantRequests || v.RequestsPerSecond != tc.wantRate || v.TTFTSamples != tc.wantRequests {
				t.Fatalf("requests %d at %.3f/s with %d TTFT samples, want %d at %.3f/s", v.Requests, v.RequestsPerSecond, v.TTFTSamples, tc.wantRequests, tc.wantRate)
			}
			if len(v.TTFTSeries.P50) != minuteBuckets || len(v.TTFTSeries.Samples) != minuteBuckets {
				t.Fatalf("series of %d points", len(v.TTFTSeries.P50))
			}
			if tc.lastIndex >= 0 {
				if p50 := v.TTFTSeries.P50[tc.lastIndex]; p50 < tc.wantLastP50 || p50 > tc.wantLastP50*1.25 || v.TTFTSeries.Samples[tc.lastIndex] != 3 {
					t.Errorf("point %d: p50 %.3f s of %d samples, want about %.3f of 3", tc.lastIndex, p50, v.TTFTSeries.Samples[tc.lastIndex], tc.wantLastP50)
				}
				if p95 := v.TTFTP95Seconds; p95 < 1.0 || p95 > 1.25 {
					t.Errorf("minute p95 %.3f s, want about 1", p95)
				}
			}
			if !v.TTFTSeries.End.Equal(t0.Add(tc.at).Truncate(time.Second)) {
				t.Errorf("series ends %v", v.TTFTSeries.End)
			}
		})
	}
	if v := (&endpoint{}).minuteView(t0); v.Requests != 0 || len(v.TTFTSeries.P50) != minuteBuckets {
		t.Errorf("an endpoint without requests: %+v", v)
	}
}

// TestDecisionsThroughRoute: requests routed by the core land in their
// scheduler's log with the endpoint that served as the winner, and in that
// endpoint's last minute.
func TestDecisionsThroughRoute(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	g := New(Options{Logger: slog.New(slog.DiscardHandler), Fleet: fleet.Config{External: true, Now: clock}})
	defer g.Close()
	cfg := &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{
		schedulerSpec("s", llama, "10.0.0.1:8000", "10.0.0.2:8000")}}}
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	served := map[string]int{}
	for i := range 3 {
		r, ref := g.Route(context.Background(), Request{RequestID: fmt.Sprint("req-", i), Model: llama})
		if ref != nil {
			t.Fatalf("refused: %+v", ref)
		}
		mu.Lock()
		now = now.Add(decisionEvery)
		mu.Unlock()
		r.FirstByte(200, true)
		r.Finish(Outcome{Status: 200})
		served[r.Served()]++
	}
	ds := g.Decisions()
	if len(ds) != 1 || ds[0].Scheduler != "s" || len(ds[0].Decisions) != 3 {
		t.Fatalf("decisions %+v", ds)
	}
	last := ds[0].Decisions[0]
	if last.RequestID != "req-2" || last.Considered != 2 || len(last.Candidates) == 0 || served[last.Winner] == 0 {
		t.Errorf("newest decision %+v", last)
	}
	total := 0
	for _, ev := range g.FleetView()[0].Endpoints {
		total += ev.LastMinute.Requests
		if ev.LastMinute.Requests != served[ev.Address] || ev.LastMinute.TTFTSamples != served[ev.Address] {
			t.Errorf("%s: last minute %+v, served %d", ev.Address, ev.LastMinute, served[ev.Address])
		}
	}
	if total != 3 {
		t.Errorf("last minute counted %d requests, want 3", total)
	}
}

// BenchmarkDecisionKeep times what the decision log adds to a decision of 64
// candidates: "kept" keeps every one (the clock moves decisionEvery each
// time), "sampled" keeps none (a burst within decisionEvery). It reports the
// median and p99 of single calls.
func BenchmarkDecisionKeep(b *testing.B) {
	ranked := candidates(64)
	for _, tc := range []struct {
		name string
		step time.Duration
	}{{"kept", decisionEvery}, {"sampled", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			var l decisionLog
			at := time.Now()
			times := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			for b.Loop() {
				at = at.Add(tc.step)
				t0 := time.Now()
				l.keep(at, "rid", llama, ranked[0].Address, len(ranked), ranked)
				if len(times) < cap(times) {
					times = append(times, time.Since(t0))
				}
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// TestDecisionLogConcurrent: decisions kept from many goroutines while the
// log is read stay within the ring, each whole (run with -race).
func TestDecisionLogConcurrent(t *testing.T) {
	var l decisionLog
	var clock atomic.Int64
	clock.Store(time.Unix(1_000_000, 0).UnixNano())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				at := time.Unix(0, clock.Add(int64(decisionEvery/2)))
				l.keep(at, fmt.Sprint(w, "-", i), llama, "10.0.0.1:8000", 3, candidates(3))
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			for _, v := range l.views() {
				if len(v.Candidates) != 3 || v.Winner != "10.0.0.1:8000" {
					t.Errorf("a torn decision: %+v", v)
					return
				}
			}
		}
	})
	wg.Wait()
	if n := len(l.views()); n != decisionLogSize {
		t.Errorf("%d decisions kept, want the ring's %d", n, decisionLogSize)
	}
}

// BenchmarkEndpointMinute times what a streamed request adds to its
// endpoint's last minute: its TTFT at the first byte and its count at the end.
func BenchmarkEndpointMinute(b *testing.B) {
	var e endpoint
	at := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now := at.Add(time.Duration(i) * time.Microsecond) // a new second every million
		e.ttftMinute(now, 40*time.Millisecond)
		e.countMinute(now)
	}
}
