package report

import (
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const msec = time.Millisecond

// fields is r as results.json would hold it, keyed by JSON name.
func fields(t *testing.T, r Result) map[string]any {
	t.Helper()
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("marshal %+v: %v", r, err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// hundred has TTFTs 1..100 ms in shuffled order, so Summarize must sort.
func hundred() []Record {
	recs := make([]Record, 100)
	for i := range recs {
		ttft := time.Duration(i+1) * msec
		recs[i] = Record{Arrival: time.Duration(i) * msec, TTFT: ttft, E2E: ttft, OutputTokens: 1}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	return recs
}

func TestSummarize(t *testing.T) {
	withErrors := append(hundred(),
		Record{Arrival: 5 * msec, E2E: 10 * time.Second, Error: true}, // its span counts; its latency does not
		Record{Arrival: 7 * msec, Error: true},
	)
	for _, tc := range []struct {
		name string
		recs []Record
		want map[string]float64 // by JSON key
	}{
		{"percentiles by nearest rank", hundred(), map[string]float64{
			"requests": 100, "errors": 0, "ttft_p50_ms": 50, "ttft_p95_ms": 95, "ttft_p99_ms": 99, "e2e_p95_ms": 95,
		}},
		{"errors counted, not in latency", withErrors, map[string]float64{
			"requests": 102, "errors": 2, "ttft_p50_ms": 50, "ttft_p95_ms": 95, "ttft_p99_ms": 99,
			"duration_s": 10.005, "output_tokens_per_s": 100 / 10.005,
		}},
		// ITLs 10, 100, 100: a one-token request has no gap between tokens, and
		// counted as 0 it would pull the median to 10.
		{"inter-token latency", []Record{
			{TTFT: 10 * msec, E2E: 100 * msec, OutputTokens: 10},
			{TTFT: 20 * msec, E2E: 420 * msec, OutputTokens: 5},
			{TTFT: 30 * msec, E2E: 230 * msec, OutputTokens: 3},
			{TTFT: 5 * msec, E2E: 5 * msec, OutputTokens: 1},
			{Error: true, E2E: 50 * msec, OutputTokens: 40},
		}, map[string]float64{"itl_p50_ms": 100, "itl_p95_ms": 100, "e2e_p95_ms": 420, "ttft_p50_ms": 10}},
		// 300 delivered tokens from the first arrival at 10 s to the last completion
		// at 13 s; the failed request's tokens were not delivered.
		{"throughput and prefix hits", []Record{
			{Arrival: 10 * time.Second, TTFT: msec, E2E: time.Second, OutputTokens: 100, PromptTokens: 100, CachedTokens: 50},
			{Arrival: 12 * time.Second, TTFT: msec, E2E: time.Second, OutputTokens: 100, PromptTokens: 100},
			{Arrival: 11 * time.Second, TTFT: msec, E2E: time.Second, OutputTokens: 100, PromptTokens: 0},
			{Arrival: 11 * time.Second, Error: true, OutputTokens: 50, PromptTokens: 100},
		}, map[string]float64{"output_tokens_per_s": 100, "duration_s": 3, "prefix_hit_rate": 0.25, "errors": 1}},
		{"empty", nil, zeros()},
		{"all failed", []Record{{Error: true}, {Error: true}}, with(zeros(), map[string]float64{"requests": 2, "errors": 2})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Summarize("mixed-gpu", "kvgate", "sim", tc.recs)
			if len(r.Records) != len(tc.recs) {
				t.Errorf("kept %d records, want %d", len(r.Records), len(tc.recs))
			}
			got := fields(t, r)
			for _, k := range []string{"scenario", "policy", "mode"} {
				if want := map[string]string{"scenario": "mixed-gpu", "policy": "kvgate", "mode": "sim"}[k]; got[k] != want {
					t.Errorf("%s = %v, want %q", k, got[k], want)
				}
			}
			for k, want := range tc.want {
				v, ok := got[k].(float64)
				if !ok || math.Abs(v-want) > 1e-9 {
					t.Errorf("%s = %v, want %v", k, got[k], want)
				}
			}
		})
	}
}

// zeros wants every number of a Result to be 0.
func zeros() map[string]float64 {
	return map[string]float64{
		"requests": 0, "errors": 0, "ttft_p50_ms": 0, "ttft_p95_ms": 0, "ttft_p99_ms": 0,
		"itl_p50_ms": 0, "itl_p95_ms": 0, "e2e_p95_ms": 0, "output_tokens_per_s": 0,
		"prefix_hit_rate": 0, "duration_s": 0,
	}
}

// with is m with the entries of over.
func with(m, over map[string]float64) map[string]float64 {
	maps.Copy(m, over)
	return m
}

func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sorted []float64
		p      int
		want   float64
	}{
		{"empty", nil, 95, 0},
		{"one", []float64{7}, 99, 7},
		{"rank rounds up", []float64{1, 2, 3}, 50, 2},
		{"p95 of 20 is the 19th", seq(20), 95, 19},
		{"p95 of 21 is the 20th", seq(21), 95, 20},
		{"p100 is the max", seq(10), 100, 10},
		{"p0 is the min", seq(10), 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Fatalf("p%d = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func seq(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	return xs
}

func TestChange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v, base float64
		want    float64
		ok      bool
		text    string
	}{
		{"lower", 29, 1000, -97.1, true, "−97.1%"},
		{"higher", 150, 100, 50, true, "+50.0%"},
		{"to zero", 0, 80, -100, true, "−100.0%"},
		{"near a full reduction keeps two decimals", 81.6, 877068.8, (81.6/877068.8 - 1) * 100, true, "−99.99%"},
		{"same", 42, 42, 0, true, "0.0%"},
		{"rounds to no change", 99.99, 100, -0.01, true, "0.0%"},
		{"zero base", 5, 0, 0, false, "n/a"},
		{"both zero", 0, 0, 0, false, "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Change(tc.v, tc.base)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Change(%v, %v) = %v, %v; want %v, %v", tc.v, tc.base, got, ok, tc.want, tc.ok)
			}
			if s := formatChange(got, ok); s != tc.text {
				t.Errorf("formatted %q, want %q", s, tc.text)
			}
		})
	}
}
