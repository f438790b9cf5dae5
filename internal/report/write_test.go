package report

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/recorder"
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
			"output_tokens_per_s", "policy", "preemptions", "prefix_hit_rate", "requests", "scenario",
			"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"}
		for i, r := range got {
			// A run large enough to judge says what its stability was judged on.
			if _, ok := r["drain"]; ok != (results[i].Drain != nil) {
				t.Fatalf("result %d: drain in JSON %v, judged %v", i, ok, results[i].Drain != nil)
			}
			delete(r, "drain")
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
			for _, want := range []string{">round-robin<", ">kvgate", strings.SplitN(name, "-ttft", 2)[0] + ": ",
				"font-family:'Liberation Serif','Times New Roman',"} {
				if !strings.Contains(string(svg), want) {
					t.Errorf("no %q (legend, title, metric-compatible fonts)", want)
				}
			}
			if strings.Contains(string(svg), "font-family:Liberation Serif;") {
				t.Errorf("a text names Liberation Serif alone")
			}
		})
	}
}

// TestWriteDegenerate draws what gonum/plot's log axes and ranges choke on.
func TestWriteDegenerate(t *testing.T) {
	same := func(n int, rec Record) []Record { return slices.Repeat([]Record{rec}, n) }
	for _, tc := range []struct {
		name     string
		recs     []Record
		overTime bool // long enough for a plot over time
	}{
		{"no records", nil, false},
		{"all failed", []Record{{Error: true}, {Arrival: time.Second, Error: true}}, false},
		{"one request", []Record{{Arrival: time.Second, TTFT: 5 * msec, E2E: 9 * msec, OutputTokens: 3}}, false},
		{"zero TTFT", []Record{{TTFT: 0, E2E: msec}, {Arrival: msec, TTFT: 0, E2E: msec}}, false},
		{"one decade exactly", []Record{{TTFT: 100 * msec}, {Arrival: time.Second, TTFT: 100 * msec}}, false},
		{"simultaneous arrivals", []Record{{Arrival: time.Second, TTFT: msec}, {Arrival: time.Second, TTFT: 2 * msec}}, false},
		{"zero TTFT over time", steady(40, 0), true},
		{"simultaneous arrivals over time", same(40, Record{Arrival: time.Second, TTFT: msec}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			results := []Result{Summarize("s", "round-robin", "sim", tc.recs), Summarize("s", "kvgate", "sim", tc.recs)}
			if err := Write(dir, nil, results, ""); err != nil {
				t.Fatal(err)
			}
			svg, err := os.ReadFile(filepath.Join(dir, "plots", "s-ttft-cdf.svg"))
			if err != nil || !strings.Contains(string(svg), "</svg>") {
				t.Fatalf("cdf: %v, %.100q", err, svg)
			}
			svg, err = os.ReadFile(filepath.Join(dir, "plots", "s-ttft-over-time.svg"))
			if tc.overTime != (err == nil) || tc.overTime && !strings.Contains(string(svg), "</svg>") {
				t.Fatalf("over time: %v, %.100q; want a plot: %v", err, svg, tc.overTime)
			}
			// Write leaves out a plot without windows, but it must draw all the same.
			if err := overTimePlot("s", results).save(filepath.Join(dir, "drawn.svg")); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("a stale plot over time is removed", func(t *testing.T) {
		dir := t.TempDir()
		long := []Result{Summarize("s", "kvgate", "sim", steady(40, msec))}
		short := []Result{Summarize("s", "kvgate", "sim", steady(10, msec))}
		for _, results := range [][]Result{long, short} {
			if err := Write(dir, nil, results, ""); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "plots", "s-ttft-over-time.svg")); !os.IsNotExist(err) {
			t.Fatalf("stat: %v, want it gone", err)
		}
	})
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

// steady is n successful requests, one every 100 ms, each of TTFT ttft.
func steady(n int, ttft time.Duration) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{Arrival: time.Duration(i) * 100 * msec, TTFT: ttft, E2E: ttft, OutputTokens: 1}
	}
	return recs
}

func TestArrivalWindows(t *testing.T) {
	// A burst: 60 requests in the first second, then 30 over the next nine.
	var bursty []Record
	for i := range 60 {
		bursty = append(bursty, Record{Arrival: time.Duration(i) * time.Second / 60, TTFT: msec})
	}
	for i := range 30 {
		bursty = append(bursty, Record{Arrival: time.Second + time.Duration(i)*300*msec, TTFT: msec})
	}
	halfFailed := steady(100, msec)
	for i := range halfFailed {
		halfFailed[i].Error = i%2 == 0
	}
	for _, tc := range []struct {
		name    string
		recs    [][]Record // per policy
		windows int        // 0: no plot
	}{
		{"90 requests make 4 windows, not 100", [][]Record{steady(90, msec), steady(90, msec)}, 4},
		{"a bursty 90 still 4", [][]Record{bursty, bursty}, 4},
		{"capped at timeWindows", [][]Record{steady(10_000, msec)}, timeWindows},
		{"the policy with fewest successes decides", [][]Record{steady(100, msec), halfFailed}, 2},
		{"a policy with none is left out", [][]Record{steady(60, msec), {{Arrival: 20 * time.Second, Error: true}}}, 3},
		{"too few for two windows", [][]Record{steady(39, msec)}, 0},
		{"nothing", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var results []Result
			for _, recs := range tc.recs {
				results = append(results, Summarize("s", "p", "sim", recs))
			}
			bounds := arrivalWindows(results)
			if tc.windows == 0 {
				if bounds != nil {
					t.Fatalf("windows %v, want none", bounds)
				}
				return
			}
			if len(bounds) != tc.windows+1 {
				t.Fatalf("%d boundaries %v, want %d windows", len(bounds), bounds, tc.windows)
			}
			// No point stands for fewer than minPerWindow requests, and a policy
			// with successful requests throughout gets a point in every window.
			for i, r := range results {
				pts, sizes := windowP95(r.Records, bounds)
				for _, n := range sizes {
					if n < minPerWindow {
						t.Errorf("policy %d: a point of %d requests", i, n)
					}
				}
				if r.Requests > r.Errors && len(pts) != tc.windows {
					t.Errorf("policy %d: %d points, want %d", i, len(pts), tc.windows)
				}
			}
		})
	}
}

func TestWindowP95(t *testing.T) {
	// 100 requests at 1 ms, but those arriving in [5 s, 7 s) at 10 ms, and one
	// failed request whose hour must not show.
	recs := steady(100, msec)
	for i := range recs {
		if at := recs[i].Arrival; at >= 5*time.Second && at < 7*time.Second {
			recs[i].TTFT = 10 * msec
		}
	}
	recs[30] = Record{Arrival: recs[30].Arrival, TTFT: time.Hour, Error: true}
	bounds := []time.Duration{0, 2 * time.Second, 5 * time.Second, 7 * time.Second, 9900 * msec}
	pts, sizes := windowP95(recs, bounds)
	for _, tc := range []struct {
		name string
		i    int
		x, y float64
		n    int
	}{
		{"first window at its middle", 0, 1, 1, 20},
		{"failed request left out", 1, 3.5, 1, 29},
		{"the slow stretch", 2, 6, 10, 20},
		{"last window takes the last arrival", 3, 8.45, 1, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(pts) != 4 {
				t.Fatalf("%d points %v (sizes %v), want 4", len(pts), pts, sizes)
			}
			if p := pts[tc.i]; math.Abs(p.X-tc.x) > 1e-9 || p.Y != tc.y || sizes[tc.i] != tc.n {
				t.Fatalf("point %d: %v of %d requests; want (%v, %v) of %d", tc.i, p, sizes[tc.i], tc.x, tc.y, tc.n)
			}
		})
	}
	t.Run("a window with fewer than minPerWindow is not drawn", func(t *testing.T) {
		pts, _ := windowP95(recs, []time.Duration{0, 1900 * msec, 9900 * msec})
		if len(pts) != 1 || pts[0].X != 5.9 {
			t.Fatalf("points %v, want only the second window's", pts)
		}
	})
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

// TestLegendFits draws the plots on a recording canvas and checks that every
// legend text, set even as much wider as a substituted font sets it, ends inside
// the canvas, right of the data.
func TestLegendFits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []string
		recs     []Record
	}{
		{"demo", []string{"round-robin", "kvgate"}, steady(90, msec)},
		{"long names", []string{"least-request", "gie-default", "prefix-affinity-and-load"}, steady(90, msec)},
		{"no successful requests", []string{"round-robin", "kvgate"}, []Record{{Error: true}}},
		{"a long note", []string{"round-robin", "kvgate"}, steady(50, msec)[:30]}, // no window of 20 for a plot of 1
	} {
		var results []Result
		for _, p := range tc.policies {
			results = append(results, Summarize("s", p, "sim", tc.recs))
		}
		for _, f := range []*figure{cdfPlot("s", results), overTimePlot("s", results)} {
			t.Run(tc.name+"/"+f.Title.Text, func(t *testing.T) {
				rec := &recorder.Canvas{}
				if err := f.draw(draw.NewCanvas(rec, plotWidth, plotHeight)); err != nil {
					t.Fatal(err)
				}
				column := plotWidth - f.legendWidth() - 2*vg.Points(8) // where the plot ends
				texts := slices.Clone(f.entries)
				drawn := map[string]bool{}
				for _, a := range rec.Actions {
					s, ok := a.(*recorder.FillString)
					if !ok || !slices.Contains(texts, s.String) {
						continue
					}
					drawn[s.String] = true
					end := s.Point.X + legendSlack*f.legend.TextStyle.Width(s.String)
					if s.Point.X < column || end > plotWidth {
						t.Errorf("%q from %v to %v (with slack), want within [%v, %v]", s.String, s.Point.X, end, column, plotWidth)
					}
				}
				slices.Sort(texts)
				if len(drawn) != len(slices.Compact(texts)) {
					t.Fatalf("drew legend texts %v, want %q", drawn, texts)
				}
			})
		}
	}
}
