package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A run can hold a million requests per policy; an SVG with a path point per
// request is tens of megabytes and draws no better than a few hundred points.
const (
	cdfPoints   = 500 // quantiles drawn per policy in a CDF
	timeWindows = 100 // at most this many arrival windows in a TTFT-over-time plot
)

// minPerWindow is the fewest successful requests a window of the over-time plot
// needs for its P95 to be drawn: below that the P95 is one request's TTFT, noise
// that reads as a trend. minWindows is the fewest windows worth a plot over time.
const minPerWindow, minWindows = 20, 2

// minPlotMS is where a latency is drawn when it is below: a log axis has no 0,
// and a simulated TTFT can be exactly 0.
const minPlotMS = 1e-3

const plotWidth, plotHeight = 20 * vg.Centimeter, 10 * vg.Centimeter

// cdfPlot draws the distribution of successful requests' TTFT, one line per
// policy, on a log axis because policies differ by orders of magnitude.
func cdfPlot(scenario string, results []Result) *figure {
	f := newFigure(scenario+": TTFT CDF", "TTFT (ms)", "fraction of successful requests")
	f.X.Scale, f.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, r := range results {
		var ttft []float64
		for _, rec := range r.Records {
			if !rec.Error {
				ttft = append(ttft, max(ms(rec.TTFT), minPlotMS))
			}
		}
		slices.Sort(ttft)
		pts := cdf(ttft, cdfPoints)
		f.addLine(i, r.Policy, pts, noLine(r))
		if len(pts) > 0 {
			lo, hi = min(lo, pts[0].X), max(hi, pts[len(pts)-1].X)
		}
	}
	f.X.Min, f.X.Max = logRange(lo, hi)
	f.Y.Min, f.Y.Max = 0, 1
	return f
}

// cdf returns at most n points of the empirical CDF of sorted: the nearest-rank
// quantiles at i/n, each at its exact cumulative fraction, so the line passes
// through the same points a full-resolution one would.
func cdf(sorted []float64, n int) plotter.XYs {
	total := len(sorted)
	n = min(n, total)
	pts := make(plotter.XYs, n)
	for i := range n {
		rank := ((i+1)*total + n - 1) / n // ⌈(i+1)·total/n⌉
		pts[i] = plotter.XY{X: sorted[rank-1], Y: float64(rank) / float64(total)}
	}
	return pts
}

// overTimePlot draws, per policy, the P95 TTFT of the successful requests of each
// window of consecutive arrivals (see arrivalWindows), so that bursts and slow
// drifts show however many requests there were. The windows are shared by the
// policies so their lines line up.
func overTimePlot(scenario string, results []Result) *figure {
	f := newFigure(scenario+": P95 TTFT over time", "arrival (s from start)", "P95 TTFT (ms)")
	f.Y.Scale, f.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	bounds := arrivalWindows(results)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, r := range results {
		pts, _ := windowP95(r.Records, bounds)
		why := noLine(r)
		if r.Requests > r.Errors {
			why = fmt.Sprintf("no window of %d", minPerWindow)
		}
		f.addLine(i, r.Policy, pts, why)
		if len(pts) > 0 && len(pts) <= markedPoints {
			f.markPoints(i, pts)
		}
		for _, pt := range pts {
			lo, hi = min(lo, pt.Y), max(hi, pt.Y)
		}
	}
	f.Y.Min, f.Y.Max = logRange(lo, hi)
	if len(bounds) > 1 {
		f.X.Min, f.X.Max = bounds[0].Seconds(), max(bounds[len(bounds)-1], bounds[0]+time.Millisecond).Seconds()
	}
	return f
}

// arrivalWindows splits the run into windows of consecutive arrivals, as many as
// timeWindows but few enough that the policy with the fewest successful requests
// has minPerWindow of them in each: equal counts rather than equal times, since a
// bursty trace leaves equal-time windows in its quiet spells nearly empty. The
// windows are cut at that policy's arrivals, and the policies replay one trace, so
// the others' windows hold at least as many. It returns the n+1 boundaries of n
// windows, window i being [b[i], b[i+1]) and the last closed; nil when there are
// fewer than minWindows windows to draw.
func arrivalWindows(results []Result) []time.Duration {
	var fewest []time.Duration
	for _, r := range results {
		var ok []time.Duration
		for _, rec := range r.Records {
			if !rec.Error {
				ok = append(ok, rec.Arrival)
			}
		}
		if len(ok) > 0 && (fewest == nil || len(ok) < len(fewest)) {
			fewest = ok
		}
	}
	n := min(timeWindows, len(fewest)/minPerWindow)
	if n < minWindows {
		return nil
	}
	slices.Sort(fewest)
	bounds := make([]time.Duration, n+1)
	for i := range n {
		bounds[i] = fewest[i*len(fewest)/n]
	}
	bounds[n] = fewest[len(fewest)-1]
	// Another policy's requests may arrive outside the span of this one's
	// successful ones; the end windows take them.
	for _, r := range results {
		for _, rec := range r.Records {
			bounds[0], bounds[n] = min(bounds[0], rec.Arrival), max(bounds[n], rec.Arrival)
		}
	}
	return bounds
}

// windowP95 returns the P95 TTFT of recs' successful requests in each window of
// bounds that holds at least minPerWindow of them, at the window's middle, and
// how many requests each drawn point stands for.
func windowP95(recs []Record, bounds []time.Duration) (pts plotter.XYs, sizes []int) {
	if len(bounds) < 2 {
		return nil, nil
	}
	n := len(bounds) - 1
	windows := make([][]float64, n)
	for _, rec := range recs {
		if rec.Error || rec.Arrival < bounds[0] || rec.Arrival > bounds[n] {
			continue
		}
		// The first boundary above the arrival ends its window; the last window
		// also takes the last arrival.
		w, _ := slices.BinarySearch(bounds[1:], rec.Arrival+1)
		w = min(w, n-1)
		windows[w] = append(windows[w], max(ms(rec.TTFT), minPlotMS))
	}
	for w, ttft := range windows {
		if len(ttft) < minPerWindow {
			continue
		}
		slices.Sort(ttft)
		mid := bounds[w] + (bounds[w+1]-bounds[w])/2
		pts = append(pts, plotter.XY{X: mid.Seconds(), Y: percentile(ttft, 95)})
		sizes = append(sizes, len(ttft))
	}
	return pts, sizes
}

// figure is a plot with its legend beside it: the lines of a plot over time cross
// every corner, so a legend inside would cover them.
type figure struct {
	*plot.Plot
	legend  plot.Legend
	entries []string // the legend's texts, which plot.Legend does not expose, to size its column
}

func newFigure(title, x, y string) *figure {
	f := &figure{Plot: plot.New(), legend: plot.NewLegend()}
	f.Title.Text = title
	f.X.Label.Text = x
	f.Y.Label.Text = y
	f.Add(plotter.NewGrid())
	f.legend.Top, f.legend.Left = true, true
	f.legend.Padding = vg.Points(3) // between entries, which touch in a wider substituted font
	return f
}

// noLine says why a policy has no line for want of successful requests, briefly:
// the legend column widens to its longest entry, at the plot's expense.
func noLine(r Result) string {
	if len(r.Records) == 0 {
		return "no requests"
	}
	return "all failed"
}

// addLine draws pts for the i-th policy. A policy with no points still gets its
// legend entry, marked with why, so that a reader does not look for a line that
// is not there.
func (f *figure) addLine(i int, policy string, pts plotter.XYs, why string) {
	l := &plotter.Line{XYs: pts, LineStyle: plotter.DefaultLineStyle}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	l.Width = vg.Points(1.5)
	if len(pts) == 0 {
		f.addEntry(policy+" ("+why+")", l)
		return
	}
	f.Add(l)
	f.addEntry(policy, l)
}

// markedPoints is the most points of a line over time that get a marker each: a
// line of a few windows would otherwise look like a finer curve than it is.
const markedPoints = 30

// markPoints draws a marker on each of pts in the i-th policy's colour.
func (f *figure) markPoints(i int, pts plotter.XYs) {
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return // only for NaN or infinite points, which a line would not show either
	}
	s.Color = plotutil.Color(i)
	s.Shape = plotutil.Shape(i)
	s.Radius = vg.Points(2.5)
	f.Add(s)
}

func (f *figure) addEntry(text string, thumb plot.Thumbnailer) {
	f.legend.Add(text, thumb)
	f.entries = append(f.entries, text)
}

// legendSlack is how much wider than measured the legend column leaves room for
// its text. The SVG names Liberation Serif, the font the text is measured in, and
// then fonts of the same metrics; a viewer with none of them substitutes a serif
// such as DejaVu Serif, which sets the same legend texts up to 31% wider.
const legendSlack = 1.35

// legendWidth is the width of the legend's column: the widest entry's thumbnail,
// the space after it and its text, measured in the legend's font, with slack.
func (f *figure) legendWidth() vg.Length {
	sty := f.legend.TextStyle
	var w vg.Length
	for _, text := range f.entries {
		w = max(w, f.legend.ThumbnailWidth+sty.Width(" ")+legendSlack*sty.Width(text))
	}
	return w
}

// logRange widens [lo, hi] to whole decades so a log axis has labelled ends, and
// gives a range even without data: gonum/plot panics on a log axis that
// reaches 0, which is where it puts an empty one.
func logRange(lo, hi float64) (float64, float64) {
	if math.IsInf(lo, 0) || math.IsInf(hi, 0) || lo <= 0 {
		return 1, 1000
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

// save draws f to an SVG file at path.
func (f *figure) save(path string) (err error) {
	c := vgsvg.New(plotWidth, plotHeight)
	if err := f.draw(draw.New(c)); err != nil {
		return fmt.Errorf("draw %s: %w", path, err)
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write plot: %w", cerr)
		}
	}()
	var svg bytes.Buffer
	if _, err := c.WriteTo(&svg); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	if _, err := out.Write(withFontFallbacks(svg.Bytes())); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// withFontFallbacks lets a viewer without Liberation Serif, which gonum/plot
// measures its text in and names alone, fall back to fonts with the same metrics
// (Times New Roman and its clones) before any other serif, so that text set
// wider than measured does not run past labels and edges. Embedding the font
// instead would add 500 KB to every plot.
func withFontFallbacks(svg []byte) []byte {
	return bytes.ReplaceAll(svg, []byte("font-family:Liberation Serif;"),
		[]byte("font-family:'Liberation Serif','Times New Roman',Times,'Nimbus Roman',Tinos,serif;"))
}

// draw puts the plot on the left of c and the legend in a column on the right,
// level with the top of the data. gonum/plot panics on what it cannot draw; that
// becomes an error, since a plot is not worth the run's other output.
func (f *figure) draw(c draw.Canvas) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("gonum/plot: %v", r)
		}
	}()
	c.SetColor(color.White) // the legend's column too, for dark-mode viewers
	c.Fill(c.Path())
	pad := vg.Points(8)
	width := f.legendWidth() + 2*pad
	f.Draw(draw.Crop(c, 0, -width, 0, 0))
	top := f.Title.TextStyle.Rectangle(f.Title.Text).Size().Y + f.Title.Padding
	f.legend.Draw(draw.Crop(c, c.Size().X-width+pad, -pad, 0, -top))
	return nil
}
