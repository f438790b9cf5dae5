package report

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
)

// run makes n records over about a minute whose TTFT is around ttft, some failed.
func run(rng *rand.Rand, n int, ttft time.Duration) []Record {
	recs := make([]Record, n)
	for i := range recs {
		arrival := time.Duration(i) * time.Minute / time.Duration(n)
		first := time.Duration(rng.ExpFloat64() * float64(ttft))
		recs[i] = Record{
			Arrival: arrival, TTFT: first, E2E: first + time.Duration(rng.IntN(100)+1)*20*msec,
			OutputTokens: 100, PromptTokens: 1000, CachedTokens: rng.IntN(1000),
		}
		if rng.IntN(50) == 0 {
			recs[i] = Record{Arrival: arrival, E2E: 10 * msec, PromptTokens: 1000, Error: true}
		}
	}
	return recs
}

func TestWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	scenarios := []Scenario{
		{Name: "mixed-gpu", Description: "Two H100s and six L4s.", Baseline: "round-robin"},
		{Name: "shared-prefix", Description: "Sixteen system prompts."},
	}
	results := []Result{
		Summarize("mixed-gpu", "round-robin", "sim", run(rng, 2000, time.Second)),
		Summarize("mixed-gpu", "kvgate", "sim", run(rng, 2000, 30*msec)),
		Summarize("shared-prefix", "round-robin", "sim", run(rng, 500, 200*msec)),
		Summarize("shared-prefix", "kvgate", "sim", nil), // drawn without data
	}
	dir := filepath.Join(t.TempDir(), "out") // Write creates it
	if err := Write(dir, scenarios, results, "header"); err != nil {
		t.Fatal(err)
	}

	js, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("results.json round-trips", func(t *testing.T) {
		var got []Result
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(results)
		for i := range want {
			want[i].Records = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
		}
	})
	t.Run("results.json keys", func(t *testing.T) {
		var got []map[string]any
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatal(err)
		}
		want := []string{"duration_s", "e2e_p95_ms", "errors", "itl_p50_ms", "itl_p95_ms", "mode",
			"output_tokens_per_s", "policy", "prefix_hit_rate", "requests", "scenario",
			"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"}
		for _, r := range got {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range r {
					if !yield(k) {
						return
					}
				}
			})
			if !slices.Equal(keys, want) {
				t.Fatalf("keys %v, want %v", keys, want)
			}
		}
	})
	t.Run("report.md", func(t *testing.T) {
		md, err := os.ReadFile(filepath.Join(dir, "report.md"))
		if err != nil {
			t.Fatal(err)
		}
		if string(md) != Markdown(scenarios, results, "header") {
			t.Fatalf("report.md is not Markdown's:\n%s", md)
		}
	})
	for _, name := range []string{
		"mixed-gpu-ttft-cdf.svg", "mixed-gpu-ttft-over-time.svg",
		"shared-prefix-ttft-cdf.svg", "shared-prefix-ttft-over-time.svg",
	} {
		t.Run(name, func(t *testing.T) {
			svg, err := os.ReadFile(filepath.Join(dir, "plots", name))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(svg), "<?xml") || !strings.Contains(string(svg), "<svg") {
				t.Fatalf("not an SVG document: %.100q", svg)
			}
			for _, want := range []string{">round-robin<", ">kvgate", strings.SplitN(name, "-ttft", 2)[0] + ": "} {
				if !strings.Contains(string(svg), want) {
					t.Errorf("no %q (legend, title)", want)
				}
			}
		})
	}
}

// TestWriteDegenerate draws what gonum/plot's log axes and ranges choke on.
func TestWriteDegenerate(t *testing.T) {
	for _, tc := range []struct {
		name string
		recs []Record
	}{
		{"no records", nil},
		{"all failed", []Record{{Error: true}, {Arrival: time.Second, Error: true}}},
		{"one request", []Record{{Arrival: time.Second, TTFT: 5 * msec, E2E: 9 * msec, OutputTokens: 3}}},
		{"zero TTFT", []Record{{TTFT: 0, E2E: msec}, {Arrival: msec, TTFT: 0, E2E: msec}}},
		{"one decade exactly", []Record{{TTFT: 100 * msec}, {Arrival: time.Second, TTFT: 100 * msec}}},
		{"simultaneous arrivals", []Record{{Arrival: time.Second, TTFT: msec}, {Arrival: time.Second, TTFT: 2 * msec}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			results := []Result{Summarize("s", "round-robin", "sim", tc.recs), Summarize("s", "kvgate", "sim", tc.recs)}
			if err := Write(dir, nil, results, ""); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"s-ttft-cdf.svg", "s-ttft-over-time.svg"} {
				svg, err := os.ReadFile(filepath.Join(dir, "plots", name))
				if err != nil || !strings.Contains(string(svg), "</svg>") {
					t.Fatalf("%s: %v, %.100q", name, err, svg)
				}
			}
		})
	}
}

func TestWriteErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		dir     string
		results []Result
		want    string
	}{
		{"dir is a file", file, nil, "create report directory"},
		{"NaN", t.TempDir(), []Result{{Scenario: "s", TTFTP95ms: nan()}}, "encode results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Write(tc.dir, nil, tc.results, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one about %q", err, tc.want)
			}
		})
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestCDF(t *testing.T) {
	for _, tc := range []struct {
		name        string
		sorted      []float64
		n           int
		len         int
		first, last plotter.XY
	}{
		{"downsampled", seq(1000), 500, 500, plotter.XY{X: 2, Y: 0.002}, plotter.XY{X: 1000, Y: 1}},
		{"fewer values than points", []float64{1, 2, 4}, 500, 3, plotter.XY{X: 1, Y: 1.0 / 3}, plotter.XY{X: 4, Y: 1}},
		{"uneven", seq(7), 3, 3, plotter.XY{X: 3, Y: 3.0 / 7}, plotter.XY{X: 7, Y: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pts := cdf(tc.sorted, tc.n)
			if len(pts) != tc.len || pts[0] != tc.first || pts[len(pts)-1] != tc.last {
				t.Fatalf("%d points from %v to %v; want %d from %v to %v",
					len(pts), pts[0], pts[len(pts)-1], tc.len, tc.first, tc.last)
			}
		})
	}
	if pts := cdf(nil, 500); len(pts) != 0 {
		t.Fatalf("empty: %v", pts)
	}
}

func TestWindowP95(t *testing.T) {
	// Ten requests a second for 100 s at 1 ms, a burst at 10 ms in second 50, a
	// failed request in second 20 whose hour must not show, and nothing in second 70.
	var recs []Record
	for i := range 1000 {
		at := time.Duration(i) * 100 * msec
		rec := Record{Arrival: at, TTFT: msec}
		switch {
		case at/time.Second == 50:
			rec.TTFT = 10 * msec
		case at == 20*time.Second:
			rec = Record{Arrival: at, TTFT: time.Hour, Error: true}
		case at/time.Second == 70:
			continue
		}
		recs = append(recs, rec)
	}
	recs = append(recs, Record{Arrival: 500 * time.Second, TTFT: 5 * msec}) // past the end: the last window
	pts := windowP95(recs, 0, time.Second)
	byWindow := map[float64]float64{}
	for _, p := range pts {
		byWindow[p.X] = p.Y
	}
	for _, tc := range []struct {
		name string
		x    float64
		want float64
		ok   bool
	}{
		{"first window at its middle", 0.5, 1, true},
		{"burst", 50.5, 10, true},
		{"failed requests left out", 20.5, 1, true},
		{"empty window left out", 70.5, 0, false},
		{"late arrival in the last window", 99.5, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := byWindow[tc.x]
			if ok != tc.ok || got != tc.want {
				t.Fatalf("window at %v s: %v, %v; want %v, %v", tc.x, got, ok, tc.want, tc.ok)
			}
		})
	}
	if len(pts) != 99 {
		t.Fatalf("%d points, want 99", len(pts))
	}
}

func TestFileName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"mixed-gpu", "mixed-gpu"},
		{"a/b c", "a_b_c"},
		{"", "scenario"},
		{"..", "scenario.."},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := fileName(tc.in); got != tc.want {
				t.Fatalf("fileName(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestWriteLarge holds the plots to their point budgets: a plot of every request
// would be tens of megabytes of SVG.
func TestWriteLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 records per policy")
	}
	dir := t.TempDir()
	start := time.Now()
	if err := Write(dir, nil, largeRun(200_000), ""); err != nil {
		t.Fatal(err)
	}
	t.Logf("Write: %v", time.Since(start))
	for _, name := range []string{"large-ttft-cdf.svg", "large-ttft-over-time.svg"} {
		fi, err := os.Stat(filepath.Join(dir, "plots", name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 256<<10 {
			t.Errorf("%s is %d KiB, want at most 256", name, fi.Size()>>10)
		}
	}
}

func largeRun(n int) []Result {
	rng := rand.New(rand.NewPCG(1, 1))
	return []Result{
		Summarize("large", "round-robin", "sim", run(rng, n, time.Second)),
		Summarize("large", "kvgate", "sim", run(rng, n, 30*msec)),
	}
}

func BenchmarkWrite(b *testing.B) {
	results := largeRun(1_000_000)
	dir := b.TempDir()
	b.ResetTimer()
	for b.Loop() {
		if err := Write(dir, nil, results, ""); err != nil {
			b.Fatal(err)
		}
	}
}
