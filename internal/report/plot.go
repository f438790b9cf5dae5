package report

import (
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
	timeWindows = 100 // arrival windows in a TTFT-over-time plot
)

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
		f.addLine(i, r.Policy, pts)
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

// overTimePlot draws, per policy, the P95 TTFT of the successful requests that
// arrived in each of timeWindows equal windows of the run, so that bursts and
// slow drifts show however many requests there were. The windows are shared by
// the policies so their lines line up.
func overTimePlot(scenario string, results []Result) *figure {
	f := newFigure(scenario+": P95 TTFT over time", "arrival (s from start)", "P95 TTFT (ms)")
	f.Y.Scale, f.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	start, end, ok := arrivalSpan(results)
	width := max((end-start)/timeWindows, 1)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, r := range results {
		pts := windowP95(r.Records, start, width)
		f.addLine(i, r.Policy, pts)
		for _, pt := range pts {
			lo, hi = min(lo, pt.Y), max(hi, pt.Y)
		}
	}
	f.Y.Min, f.Y.Max = logRange(lo, hi)
	if ok {
		f.X.Min, f.X.Max = start.Seconds(), max(end, start+width).Seconds()
	}
	return f
}

// windowP95 returns the P95 TTFT of successful records per window of width from
// start, at the window's middle; windows without one are left out.
func windowP95(recs []Record, start, width time.Duration) plotter.XYs {
	windows := make([][]float64, timeWindows)
	for _, rec := range recs {
		if rec.Error {
			continue
		}
		w := min(int((rec.Arrival-start)/width), timeWindows-1)
		windows[w] = append(windows[w], max(ms(rec.TTFT), minPlotMS))
	}
	var pts plotter.XYs
	for w, ttft := range windows {
		if len(ttft) == 0 {
			continue
		}
		slices.Sort(ttft)
		mid := start + time.Duration(w)*width + width/2
		pts = append(pts, plotter.XY{X: mid.Seconds(), Y: percentile(ttft, 95)})
	}
	return pts
}

// arrivalSpan is the first and last arrival across results, and whether there
// was any.
func arrivalSpan(results []Result) (start, end time.Duration, ok bool) {
	for _, r := range results {
		for _, rec := range r.Records {
			if !ok {
				start, end, ok = rec.Arrival, rec.Arrival, true
			}
			start, end = min(start, rec.Arrival), max(end, rec.Arrival)
		}
	}
	return start, end, ok
}

// figure is a plot with its legend beside it: the lines of a plot over time cross
// every corner, so a legend inside would cover them.
type figure struct {
	*plot.Plot
	legend plot.Legend
}

func newFigure(title, x, y string) *figure {
	f := &figure{Plot: plot.New(), legend: plot.NewLegend()}
	f.Title.Text = title
	f.X.Label.Text = x
	f.Y.Label.Text = y
	f.Add(plotter.NewGrid())
	f.legend.Top, f.legend.Left = true, true
	return f
}

// addLine draws pts for the i-th policy. A policy with no points still gets its
// legend entry, marked, so that a reader does not look for a line that is not
// there.
func (f *figure) addLine(i int, policy string, pts plotter.XYs) {
	l := &plotter.Line{XYs: pts, LineStyle: plotter.DefaultLineStyle}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	l.Width = vg.Points(1.5)
	if len(pts) == 0 {
		f.legend.Add(policy+" (no successful requests)", l)
		return
	}
	f.Add(l)
	f.legend.Add(policy, l)
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
	if _, err := c.WriteTo(out); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
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
	width := f.legend.Rectangle(c).Size().X + 2*pad
	f.Draw(draw.Crop(c, 0, -width, 0, 0))
	top := f.Title.TextStyle.Rectangle(f.Title.Text).Size().Y + f.Title.Padding
	f.legend.Draw(draw.Crop(c, c.Size().X-width+pad, -pad, 0, -top))
	return nil
}
