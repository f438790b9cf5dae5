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

// Markdown renders report.md: a title and the caller's header paragraph (command
// line, seed, date), then per scenario its description, target, a table of the
// numbers with one row per policy in the order given, a table of the changes
// against the baseline, and the two plots that Write draws.
func Markdown(scenarios []Scenario, results []Result, header string) string {
	var b strings.Builder
	b.WriteString("# kvgate bench\n\n")
	if h := strings.TrimSpace(header); h != "" {
		b.WriteString(h + "\n\n")
	}
	for _, s := range sections(scenarios, results) {
		fmt.Fprintf(&b, "## %s\n\n", s.Name)
		if d := strings.TrimSpace(s.Description); d != "" {
			b.WriteString(d + "\n\n")
		}
		if s.Target != "" {
			fmt.Fprintf(&b, "**Target:** %s\n\n", s.Target)
		}
		if len(s.results) == 0 {
			b.WriteString("_No results._\n\n")
			continue
		}
		if m := modes(s.results); m != "" {
			fmt.Fprintf(&b, "Mode: %s.\n\n", m)
		}
		numbersTable(&b, s.results)
		changeTable(&b, s)
		cdf, overTime := plotPaths(s.Name)
		fmt.Fprintf(&b, "![TTFT CDF, %s](%s)\n\n", s.Name, cdf)
		fmt.Fprintf(&b, "![P95 TTFT over time, %s](%s)\n\n", s.Name, overTime)
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func numbersTable(b *strings.Builder, results []Result) {
	b.WriteString("| policy | requests | errors | TTFT p50 (ms) | TTFT p95 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p95 (ms) | E2E p95 (ms) | output tok/s | prefix hit rate |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %.1f | %.1f%% |\n",
			cell(r.Policy), r.Requests, r.Errors,
			fmtMS(r.TTFTP50ms), fmtMS(r.TTFTP95ms), fmtMS(r.TTFTP99ms),
			fmtMS(r.ITLP50ms), fmtMS(r.ITLP95ms), fmtMS(r.E2EP95ms),
			r.OutputTokensPerS, 100*r.PrefixHitRate)
	}
	b.WriteString("\n")
}

// changeTable has a row per policy but the baseline, whose row would be all zeros.
func changeTable(b *strings.Builder, s section) {
	base, ok := s.base()
	rows := 0
	for _, r := range s.results {
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
	for _, r := range s.results {
		if r.Policy == s.baseline() {
			continue
		}
		p95, p99, tput := changes(r, base, ok)
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", cell(r.Policy), p95, p99, tput)
	}
	b.WriteString("\n")
}

// changes formats r's changes of TTFT p95, TTFT p99 and throughput against base;
// all n/a when the baseline was not run.
func changes(r, base Result, haveBase bool) (p95, p99, tput string) {
	if !haveBase {
		return "n/a", "n/a", "n/a"
	}
	return formatChange(Change(r.TTFTP95ms, base.TTFTP95ms)),
		formatChange(Change(r.TTFTP99ms, base.TTFTP99ms)),
		formatChange(Change(r.OutputTokensPerS, base.OutputTokensPerS))
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
// the terminal at the end of a run. Write errors are ignored: it is a courtesy
// print, and the files are the record.
func Summary(w io.Writer, scenarios []Scenario, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tpolicy\terrors\tTTFT p95 ms\tTTFT p99 ms\ttok/s\tΔp95\tΔp99\tΔtok/s")
	for _, s := range sections(scenarios, results) {
		base, ok := s.base()
		for _, r := range s.results {
			p95, p99, tput := changes(r, base, ok)
			if r.Policy == s.baseline() {
				p95, p99, tput = "base", "base", "base"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.1f\t%s\t%s\t%s\n",
				s.Name, r.Policy, r.Errors, fmtMS(r.TTFTP95ms), fmtMS(r.TTFTP99ms),
				r.OutputTokensPerS, p95, p99, tput)
		}
	}
	_ = tw.Flush()
}
