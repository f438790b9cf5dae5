package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Doc is what a report says besides its results.
type Doc struct {
	// Header is the paragraph under the title (command line, seed, date); one
	// that starts with a "# " title line replaces the default title "kvgate bench".
	Header string
	// Policies describes each policy in a line, for the report's list of the
	// policies it compares.
	Policies map[string]string
}

// Markdown renders report.md with the given header and no policy descriptions
// (MarkdownDoc).
func Markdown(scenarios []Scenario, results []Result, header string) string {
	return MarkdownDoc(scenarios, results, Doc{Header: header})
}

// MarkdownDoc renders report.md: a title and the header; how percentiles,
// stability, floors and draws are taken; the policies compared with their
// descriptions; a headline table, one line per scenario, of kvgate's P95 TTFT
// against the floor, the oracle and the baselines users run. Then per scenario
// its description, target (each goal met, not met, infeasible below the floor,
// or not assessable against a queue that never drained), floor, headline
// (kvgate against the oracle and each baseline at P95 and P99), a table of the
// numbers with one row per policy in the order given, a table of the changes
// against the baseline, what each server got when the scenario lists its
// servers, and the plots that Write draws, each with a caption saying what its
// points are.
func MarkdownDoc(scenarios []Scenario, results []Result, doc Doc) string {
	var b strings.Builder
	h := strings.TrimSpace(doc.Header)
	if !strings.HasPrefix(h, "# ") {
		b.WriteString("# kvgate bench\n\n")
	}
	if h != "" {
		b.WriteString(h + "\n\n")
	}
	b.WriteString(PercentileDefinition + "\n\n")
	secs := sections(scenarios, results)
	if len(results) > 0 {
		b.WriteString(StabilityDefinition + "\n\n")
	}
	if slices.ContainsFunc(secs, func(s section) bool { return s.Floor != nil }) {
		b.WriteString(FloorDefinition + "\n\n")
	}
	if slices.ContainsFunc(secs, func(s section) bool { return slices.ContainsFunc(s.rows(), row.drawn) }) {
		b.WriteString(DrawsDefinition + "\n\n")
	}
	policiesList(&b, results, doc.Policies)
	overview(&b, secs)
	for _, s := range secs {
		fmt.Fprintf(&b, "## %s\n\n", s.Name)
		if d := strings.TrimSpace(s.Description); d != "" {
			b.WriteString(d + "\n\n")
		}
		targets(&b, s)
		floorLine(&b, s)
		if len(s.results) == 0 {
			b.WriteString("_No results._\n\n")
			continue
		}
		headline(&b, s)
		if m := modes(s.results); m != "" {
			fmt.Fprintf(&b, "Mode: %s.\n\n", m)
		}
		numbersTable(&b, s)
		changeTable(&b, s)
		serversTable(&b, s)
		cdf, overTime := plotPaths(s.Name)
		fmt.Fprintf(&b, "![TTFT CDF, %s](%s)\n\n", s.Name, cdf)
		b.WriteString("_TTFT CDF: for each policy, the fraction of its successful requests whose TTFT was at most x._\n\n")
		caption, drawn := overTimeCaption(s.plotted())
		if drawn {
			fmt.Fprintf(&b, "![P95 TTFT over time, %s](%s)\n\n", s.Name, overTime)
		}
		b.WriteString(caption + "\n\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// noSharedPrefixes stands in a table for the prefix hit rate of a trace without
// shared prefixes, where 0.0% would read as a cache that failed.
const noSharedPrefixes = "no shared prefixes in this trace"

func numbersTable(b *strings.Builder, s section) {
	b.WriteString("| policy | requests | errors | TTFT p50 (ms) | TTFT p95 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p95 (ms) | E2E p95 (ms) | output tok/s | prefix hit rate |")
	align := "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
	if s.preempted() {
		b.WriteString(" preemptions |")
		align += "--:|"
	}
	b.WriteString("\n" + align + "\n")
	if f := s.Floor; f != nil {
		fmt.Fprintf(b, "| idle-engine floor (reference) | %d | — | %s | %s | %s | — | — | — | — | — |",
			f.Requests, fmtMS(f.P50ms), fmtMS(f.P95ms), fmtMS(f.P99ms))
		if s.preempted() {
			b.WriteString(" — |")
		}
		b.WriteString("\n")
	}
	var unstable []string
	for _, r := range s.rows() {
		numbersRow(b, s, label(r), r)
		if u := r.undrained(); len(u) > 0 {
			numbersRow(b, s, fmt.Sprintf("%s: the %d of %d draws that never drained (median, unstable)", r.Policy, len(u), len(r.draws)), newRow(u))
			unstable = append(unstable, fmt.Sprintf("%s: %d of %d draws", cell(r.Policy), len(u), len(r.draws)))
		}
		if r.Unstable {
			what := cell(r.Policy)
			if r.drawn() {
				what += fmt.Sprintf(": all %d draws", len(r.draws))
			}
			if d := r.Drain; d != nil {
				what += fmt.Sprintf(" (P95 TTFT of the last tenth of arrivals %s, of the second tenth %s, arrivals spanning %s)",
					fmtLatency(d.LastTenthP95ms), fmtLatency(d.SecondTenthP95ms), fmtLatency(1000*d.ArrivalSpanS))
			}
			unstable = append(unstable, what)
		}
	}
	b.WriteString("\n")
	if s.NoSharedPrefixes {
		b.WriteString("Prefix hit rate n/a: " + noSharedPrefixes + ", so a prefix cache has nothing to hit.\n\n")
	}
	if s.preempted() {
		b.WriteString(PreemptionsDefinition + "\n\n")
	}
	if len(unstable) > 0 {
		b.WriteString("**Never drained** (unstable: latencies are lower bounds, ≥): " + strings.Join(unstable, "; ") + ".\n\n")
	}
}

// numbersRow writes one row of the numbers table; a drawn row gives the range
// over its draws beside its TTFT percentiles and throughput.
func numbersRow(b *strings.Builder, s section, name string, r row) {
	hits := fmt.Sprintf("%.1f%%", 100*r.PrefixHitRate)
	if s.NoSharedPrefixes {
		hits = "n/a"
	}
	spread := func(f func(*Result) *float64, format func(float64) string) string {
		v := format(*f(&r.Result))
		if r.drawn() {
			v += fmt.Sprintf(" (%s–%s)", format(*f(&r.lo)), format(*f(&r.hi)))
		}
		return v
	}
	lat := func(f func(*Result) *float64) string { return bound(spread(f, fmtMS), r.Unstable) }
	tput := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |",
		cell(name), r.Requests, r.Errors,
		lat(func(r *Result) *float64 { return &r.TTFTP50ms }), lat(func(r *Result) *float64 { return &r.TTFTP95ms }),
		lat(func(r *Result) *float64 { return &r.TTFTP99ms }),
		fmtMS(r.ITLP50ms), fmtMS(r.ITLP95ms), bound(fmtMS(r.E2EP95ms), r.Unstable),
		spread(func(r *Result) *float64 { return &r.OutputTokensPerS }, tput), hits)
	if s.preempted() {
		n := strconv.Itoa(r.Preemptions)
		if r.drawn() {
			n += fmt.Sprintf(" (%d–%d)", r.lo.Preemptions, r.hi.Preemptions)
		}
		fmt.Fprintf(b, " %s |", n)
	}
	b.WriteString("\n")
}

// PreemptionsDefinition says, under a table with a preemptions column, what
// it counts.
const PreemptionsDefinition = "Preemptions: sequences the engines evicted from their KV cache to make room for the running ones " +
	"(vLLM's num_preemptions), summed over the fleet; a preempted sequence waits and computes its context again. " +
	"The column is shown where some run preempted."

// preempted says whether some run of the section preempted a sequence.
func (s section) preempted() bool {
	return slices.ContainsFunc(s.results, func(r Result) bool { return r.Preemptions > 0 })
}

// serversTable shows, when the scenario lists its servers, how many requests each
// server and each GPU type answered under each policy and at what TTFT: what a
// policy did with the fleet, which the totals above only show the outcome of.
func serversTable(b *strings.Builder, s section) {
	if len(s.Servers) == 0 {
		return
	}
	results := s.plotted()
	shares := make([][]Share, len(results))
	for i, r := range results {
		shares[i] = Shares(s.Servers, r)
	}
	b.WriteString("Requests answered by each server, and their TTFT (ms), under each policy:\n\n| GPU | server |")
	align := "|---|---|"
	for _, r := range results {
		fmt.Fprintf(b, " %s: requests | p50 | p95 |", cell(r.Policy))
		align += "--:|--:|--:|"
	}
	b.WriteString("\n" + align + "\n")
	// Every policy's shares have the same rows but for the unlisted one, which
	// only some may have; rows are taken from the policy with the most.
	rows := slices.MaxFunc(shares, func(a, b []Share) int { return len(a) - len(b) })
	for row, first := range rows {
		gpu, server := cell(first.GPU), cell(first.Server)
		switch {
		case first.Total:
			gpu, server = "**"+gpu+"**", "**all "+gpu+"**"
		case first.GPU == "":
			gpu, server = "—", "none (failed or unlisted)"
		}
		fmt.Fprintf(b, "| %s | %s |", gpu, server)
		for i, r := range results {
			if row >= len(shares[i]) {
				b.WriteString(" 0 | — | — |")
				continue
			}
			sh := shares[i][row]
			n := strconv.Itoa(sh.Requests)
			if r.Requests > 0 {
				n += fmt.Sprintf(" (%.0f%%)", 100*float64(sh.Requests)/float64(r.Requests))
			}
			if sh.Errors > 0 {
				n += fmt.Sprintf(", %d failed", sh.Errors)
			}
			p50, p95 := "—", "—"
			if sh.Requests > sh.Errors {
				p50, p95 = fmtMS(sh.TTFTP50ms), fmtMS(sh.TTFTP95ms)
			}
			fmt.Fprintf(b, " %s | %s | %s |", n, p50, p95)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// overTimeCaption says what a point of the over-time plot is, and whether there
// is a plot: false, with the reason, when the run is too short for windows of
// minPerWindow requests.
func overTimeCaption(results []Result) (string, bool) {
	bounds := arrivalWindows(results)
	if bounds == nil {
		return fmt.Sprintf("_No P95 TTFT over time: a point needs a window of at least %d successful requests, "+
			"and this run has too few for %d windows._", minPerWindow, minWindows), false
	}
	lo, hi := 0, 0
	for _, r := range results {
		_, sizes := windowP95(r.Records, bounds)
		for _, n := range sizes {
			if lo == 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
	}
	size := strconv.Itoa(lo)
	if hi > lo {
		size = fmt.Sprintf("%d–%d", lo, hi)
	}
	return fmt.Sprintf("_P95 TTFT over time: the run's arrivals cut into %d windows of consecutive requests; each point "+
		"is the P95 TTFT of one window's successful requests (%s of them, never fewer than %d), drawn at the "+
		"middle of the window's arrival times._", len(bounds)-1, size, minPerWindow), true
}

// changeTable has a row per policy but the baseline, whose row would be all
// zeros; a drawn policy's row gives the range of its draws' changes.
func changeTable(b *strings.Builder, s section) {
	base, ok := s.base()
	rows := 0
	for _, r := range s.rows() {
		if r.Policy != s.baseline() {
			rows++
		}
	}
	if rows == 0 {
		return
	}
	fmt.Fprintf(b, "Change against %s", s.baseline())
	if !ok {
		b.WriteString(" (not run, so n/a)")
	}
	b.WriteString(":\n\n| policy | TTFT p95 | TTFT p99 | output tok/s |\n|---|--:|--:|--:|\n")
	for _, r := range s.rows() {
		if r.Policy == s.baseline() {
			continue
		}
		p95, p99, tput := changes(r, base, ok)
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", cell(label(r)), cell(p95), cell(p99), cell(tput))
	}
	b.WriteString("\n")
}

// changes formats r's changes of TTFT p95, TTFT p99 and throughput against base
// (flagged or bounded where either never drained, with the range over a drawn
// row's draws); all n/a when the baseline was not run.
func changes(r, base row, haveBase bool) (p95, p99, tput string) {
	if !haveBase {
		return "n/a", "n/a", "n/a"
	}
	one := func(f func(*Result) *float64, latency bool) string {
		bv := *f(&base.Result)
		v := versus(*f(&r.Result), bv, r.Unstable, base.Unstable, base.Policy, latency)
		if r.drawn() && !strings.HasPrefix(v, "n/a") && (!latency || !base.Unstable) {
			lo, _ := Change(*f(&r.lo), bv)
			hi, _ := Change(*f(&r.hi), bv)
			v += fmt.Sprintf(" (%s to %s)", formatChange(lo, true), formatChange(hi, true))
		}
		return v
	}
	return one(func(r *Result) *float64 { return &r.TTFTP95ms }, true),
		one(func(r *Result) *float64 { return &r.TTFTP99ms }, true),
		one(func(r *Result) *float64 { return &r.OutputTokensPerS }, false)
}

// formatChange writes a change as "−97.1%" or "+4.0%", with a real minus sign
// because a hyphen reads as a dash in a table; "n/a" when there is no change.
func formatChange(pct float64, ok bool) string {
	if !ok || math.IsNaN(pct) || math.IsInf(pct, 0) {
		return "n/a"
	}
	digits := 1
	if math.Abs(pct) >= 99.5 && math.Abs(pct) < 100 {
		// Near a full reduction one decimal would print −100.0% for −99.98%.
		digits = 2
	}
	s := strconv.FormatFloat(math.Abs(pct), 'f', digits, 64)
	switch {
	case s == "0.0": // no sign on a change that rounds away, e.g. −0.04
		return "0.0%"
	case pct < 0:
		return "−" + s + "%"
	default:
		return "+" + s + "%"
	}
}

// fmtMS keeps about three significant digits for the sub-10 ms latencies of the
// simulator without cluttering seconds-long ones.
func fmtMS(v float64) string {
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// cell escapes what would end a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// modes lists the distinct modes of results in order of appearance.
func modes(results []Result) string {
	var seen []string
	for _, r := range results {
		if r.Mode != "" && !slices.Contains(seen, r.Mode) {
			seen = append(seen, r.Mode)
		}
	}
	return strings.Join(seen, ", ")
}

// Summary writes a short plain-text table to w, one line per scenario × policy with
// TTFT p95, p99, throughput and their changes against the scenario's baseline, for
// the terminal at the end of a run: a drawn policy's median, the oracle marked as
// the reference, an unstable run's latencies as lower bounds, and the floor first
// when it is known. Write errors are ignored: it is a courtesy print, and the
// files are the record.
func Summary(w io.Writer, scenarios []Scenario, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tpolicy\terrors\tTTFT p95 ms\tTTFT p99 ms\ttok/s\tΔp95\tΔp99\tΔtok/s")
	for _, s := range sections(scenarios, results) {
		if f := s.Floor; f != nil && len(s.results) > 0 {
			fmt.Fprintf(tw, "%s\tidle-engine floor\t\t%s\t%s\t\t\t\t\n", s.Name, fmtMS(f.P95ms), fmtMS(f.P99ms))
		}
		base, ok := s.base()
		for _, r := range s.rows() {
			p95, p99, tput := changes(r, base, ok)
			if r.Policy == s.baseline() {
				p95, p99, tput = "base", "base", "base"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.1f\t%s\t%s\t%s\n",
				s.Name, label(r), r.Errors, bound(fmtMS(r.TTFTP95ms), r.Unstable), bound(fmtMS(r.TTFTP99ms), r.Unstable),
				r.OutputTokensPerS, p95, p99, tput)
		}
	}
	_ = tw.Flush()
}
