package report

import (
	"strings"
	"testing"
)

// fixture is two scenarios: mixed-gpu with its baseline run, bursty without it,
// and results of a scenario nobody described.
func fixture() ([]Scenario, []Result) {
	scenarios := []Scenario{
		{Name: "mixed-gpu", Description: "Two H100s and six L4s.", Baseline: "round-robin", Target: "P95 TTFT ≤ −97% vs round-robin"},
		{Name: "bursty", Description: "Bursts of 10× the mean rate."}, // baseline defaults to round-robin
		{Name: "idle", Description: "Nothing was run."},
	}
	results := []Result{
		{Scenario: "mixed-gpu", Policy: "round-robin", Mode: "sim", Requests: 1000, Errors: 2,
			TTFTP50ms: 500, TTFTP95ms: 1000, TTFTP99ms: 2000, ITLP50ms: 20, ITLP95ms: 40, E2EP95ms: 5000,
			OutputTokensPerS: 100, PrefixHitRate: 0.125},
		{Scenario: "mixed-gpu", Policy: "least-request", Mode: "sim", Requests: 1000,
			TTFTP50ms: 100, TTFTP95ms: 500, TTFTP99ms: 2000, OutputTokensPerS: 90},
		{Scenario: "mixed-gpu", Policy: "kvgate", Mode: "sim", Requests: 1000,
			TTFTP50ms: 5.5, TTFTP95ms: 29, TTFTP99ms: 100, ITLP50ms: 7.25, OutputTokensPerS: 150, PrefixHitRate: 0.5},
		{Scenario: "bursty", Policy: "kvgate", Mode: "live", Requests: 10, TTFTP95ms: 3},
		{Scenario: "shared-prefix", Policy: "kvgate", Mode: "sim", Requests: 1},
	}
	return scenarios, results
}

func TestMarkdown(t *testing.T) {
	scenarios, results := fixture()
	md := Markdown(scenarios, results, "`kvgate bench --seed 7`, 2026-01-02.")
	for _, tc := range []struct {
		name string
		want string
		not  bool
	}{
		{"header", "`kvgate bench --seed 7`, 2026-01-02.", false},
		{"description", "Two H100s and six L4s.", false},
		{"target", "**Target:** P95 TTFT ≤ −97% vs round-robin", false},
		{"mode", "Mode: sim.", false},
		{"baseline row", "| round-robin | 1000 | 2 | 500.0 | 1000.0 | 2000.0 | 20.0 | 40.0 | 5000.0 | 100.0 | 12.5% |", false},
		{"small latencies keep two decimals", "| kvgate | 1000 | 0 | 5.50 | 29.0 | 100.0 | 7.25 | 0.00 | 0.00 | 150.0 | 50.0% |", false},
		{"change against the baseline", "Change against round-robin:", false},
		{"lower is negative, higher positive", "| kvgate | −97.1% | −95.0% | +50.0% |", false},
		{"no change", "| least-request | −50.0% | 0.0% | −10.0% |", false},
		{"no change row for the baseline itself", "| round-robin | 0.0%", true},
		{"cdf plot", "](plots/mixed-gpu-ttft-cdf.svg)", false},
		{"over-time plot", "](plots/mixed-gpu-ttft-over-time.svg)", false},
		{"missing baseline", "| kvgate | n/a | n/a | n/a |", false},
		{"missing baseline said", "Change against round-robin (not run, so n/a):", false},
		{"scenario without results", "## idle\n\nNothing was run.\n\n_No results._", false},
		{"no plots without results", "plots/idle-", true},
		{"undescribed scenario kept", "## shared-prefix", false},
		{"no hyphen for minus", "| -", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(md, tc.want) == tc.not {
				t.Fatalf("contains %q: %v, want %v; report:\n%s", tc.want, !tc.not, !tc.not, md)
			}
		})
	}
	t.Run("order", func(t *testing.T) {
		var at []int
		for _, s := range []string{"## mixed-gpu", "| round-robin | 1000", "| least-request | 1000", "| kvgate | 1000", "## bursty", "## idle", "## shared-prefix"} {
			at = append(at, strings.Index(md, s))
		}
		for i := 1; i < len(at); i++ {
			if at[i-1] < 0 || at[i] <= at[i-1] {
				t.Fatalf("sections and rows out of the given order (positions %v):\n%s", at, md)
			}
		}
	})
}

func TestSummary(t *testing.T) {
	scenarios, results := fixture()
	var b strings.Builder
	Summary(&b, scenarios, results)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 1+len(results) {
		t.Fatalf("%d lines, want a header and one per result:\n%s", len(lines), b.String())
	}
	for _, tc := range []struct {
		line int
		want []string
	}{
		{1, []string{"mixed-gpu", "round-robin", "1000.0", "2000.0", "100.0", "base"}},
		{3, []string{"mixed-gpu", "kvgate", "29.0", "−97.1%", "−95.0%", "+50.0%"}},
		{4, []string{"bursty", "kvgate", "n/a"}},
	} {
		t.Run(tc.want[0]+"/"+tc.want[1], func(t *testing.T) {
			fs := strings.Fields(lines[tc.line])
			for _, w := range tc.want {
				if !strings.Contains(" "+strings.Join(fs, " ")+" ", " "+w+" ") {
					t.Fatalf("line %q lacks %q", lines[tc.line], w)
				}
			}
		})
	}
}
