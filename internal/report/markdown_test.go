package report

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
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
		{"cdf caption", "_TTFT CDF: for each policy, the fraction of its successful requests", false},
		{"no over-time plot without records", "_No P95 TTFT over time: a point needs a window of at least 20 successful requests", false},
		{"no link to an over-time plot not drawn", "-ttft-over-time.svg", true},
		{"percentile definition", "Percentiles are nearest-rank over successful requests", false},
		{"prefix hit rate when the trace may share prefixes", "| 12.5% |", false},
		{"no servers table unless servers are listed", "Requests answered by each server", true},
		{"missing baseline", "| kvgate | n/a | n/a | n/a |", false},
		{"missing baseline said", "Change against round-robin (not run, so n/a):", false},
		{"scenario without results", "## idle\n\nNothing was run.\n\n_No results._", false},
		{"no plots without results", "plots/idle-", true},
		{"undescribed scenario kept", "## shared-prefix", false},
		{"no hyphen for minus", "| -", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(md, tc.want) == tc.not {
				t.Fatalf("contains %q: %v, want %v; report:\n%s", tc.want, tc.not, !tc.not, md)
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

// fleet is two H100s and an A10G, with runs of 90 requests per policy: under
// round-robin 30 each, under kvgate 40, 40 and 10, one of its requests failed.
func fleet() ([]Server, []Result) {
	servers := []Server{
		{Endpoint: "10.0.0.1:8000", Name: "h100-0", GPU: "h100"},
		{Endpoint: "10.0.0.2:8000", Name: "h100-1", GPU: "h100"},
		{Endpoint: "10.0.0.3:8000", Name: "a10g-0", GPU: "a10g"},
	}
	run := func(policy string, counts [3]int, failed int) Result {
		var recs []Record
		for s, n := range counts {
			for i := range n {
				ttft := time.Duration(1+i) * msec
				if s == 2 {
					ttft *= 100 // the A10G is slow
				}
				recs = append(recs, Record{Arrival: time.Duration(len(recs)) * 100 * msec, TTFT: ttft, E2E: 2 * ttft,
					OutputTokens: 2, PromptTokens: 100, Endpoint: servers[s].Endpoint})
			}
		}
		for range failed {
			recs = append(recs, Record{Arrival: time.Duration(len(recs)) * 100 * msec, Error: true})
		}
		return Summarize("demo", policy, "live", recs)
	}
	return servers, []Result{run("round-robin", [3]int{30, 30, 30}, 0), run("kvgate", [3]int{40, 39, 10}, 1)}
}

func TestShares(t *testing.T) {
	servers, results := fleet()
	for _, tc := range []struct {
		name   string
		result Result
		want   []string // GPU/server/total: requests errors p50 p95
	}{
		{"round-robin", results[0], []string{
			"h100/h100-0/false: 30 0 15 29", "h100/h100-1/false: 30 0 15 29", "h100//true: 60 0 15 29",
			"a10g/a10g-0/false: 30 0 1500 2900", "a10g//true: 30 0 1500 2900",
		}},
		{"kvgate, with a failed request no server answered", results[1], []string{
			"h100/h100-0/false: 40 0 20 38", "h100/h100-1/false: 39 0 20 38", "h100//true: 79 0 20 38",
			"a10g/a10g-0/false: 10 0 500 1000", "a10g//true: 10 0 500 1000", "//false: 1 1 0 0",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range Shares(servers, tc.result) {
				got = append(got, fmt.Sprintf("%s/%s/%v: %d %d %g %g", s.GPU, s.Server, s.Total, s.Requests, s.Errors, s.TTFTP50ms, s.TTFTP95ms))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("shares\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
	t.Run("one server is the whole run, percentiles and all", func(t *testing.T) {
		all := []Server{{Endpoint: "10.0.0.1:8000", Name: "a", GPU: "h100"}, {Endpoint: "10.0.0.2:8000", Name: "b", GPU: "h100"},
			{Endpoint: "10.0.0.3:8000", Name: "c", GPU: "h100"}, {Endpoint: "10.0.0.1:8000", Name: "dup", GPU: "h100"}}
		shares := Shares(all, results[0])
		total := shares[len(shares)-1]
		if len(shares) != 4 || !total.Total || total.Requests != results[0].Requests ||
			total.TTFTP50ms != results[0].TTFTP50ms || total.TTFTP95ms != results[0].TTFTP95ms || total.TTFTP99ms != results[0].TTFTP99ms {
			t.Fatalf("shares %+v, want three servers and a total equal to the run %+v", shares, results[0])
		}
	})
}

func TestMarkdownServers(t *testing.T) {
	servers, results := fleet()
	md := Markdown([]Scenario{{Name: "demo", Servers: servers}}, results, "")
	for _, tc := range []struct {
		name, want string
	}{
		{"heading", "| GPU | server | round-robin: requests | p50 | p95 | kvgate: requests | p50 | p95 |"},
		{"a server's row", "| h100 | h100-0 | 30 (33%) | 15.0 | 29.0 | 40 (44%) | 20.0 | 38.0 |"},
		{"a GPU type's total", "| **h100** | **all h100** | 60 (67%) | 15.0 | 29.0 | 79 (88%) | 20.0 | 38.0 |"},
		{"the slow GPU", "| a10g | a10g-0 | 30 (33%) | 1500.0 | 2900.0 | 10 (11%) | 500.0 | 1000.0 |"},
		{"requests no server answered", "| — | none (failed or unlisted) | 0 | — | — | 1 (1%), 1 failed | — | — |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(md, tc.want) {
				t.Fatalf("no %q in\n%s", tc.want, md)
			}
		})
	}
}

func TestMarkdownNoSharedPrefixes(t *testing.T) {
	_, results := fleet()
	for _, tc := range []struct {
		name     string
		none     bool
		want     []string
		wantNone []string
	}{
		{"trace without shared prefixes", true, []string{"| n/a |", "Prefix hit rate n/a: no shared prefixes in this trace"}, []string{"0.0%"}},
		{"trace that may share them", false, []string{"| 0.0% |"}, []string{"no shared prefixes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := Markdown([]Scenario{{Name: "demo", NoSharedPrefixes: tc.none}}, results, "")
			for _, w := range tc.want {
				if !strings.Contains(md, w) {
					t.Errorf("no %q in\n%s", w, md)
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(md, w) {
					t.Errorf("%q in\n%s", w, md)
				}
			}
		})
	}
}

// The preemptions column is shown in a scenario where some run preempted, a
// drawn policy's with its range, and left out where none did.
func TestMarkdownPreemptions(t *testing.T) {
	floor := NewFloor([]time.Duration{time.Millisecond}, []time.Duration{time.Millisecond})
	scenarios := []Scenario{{Name: "pressure", Floor: &floor}, {Name: "calm"}}
	results := []Result{
		{Scenario: "pressure", Policy: "round-robin", Requests: 10, Preemptions: 120},
		{Scenario: "pressure", Policy: "kvgate", Requests: 10},
		{Scenario: "pressure", Policy: "kube-proxy", Requests: 10, Preemptions: 30, Draw: 0},
		{Scenario: "pressure", Policy: "kube-proxy", Requests: 10, Preemptions: 90, Draw: 1},
		{Scenario: "pressure", Policy: "kube-proxy", Requests: 10, Preemptions: 50, Draw: 2},
		{Scenario: "calm", Policy: "kvgate", Requests: 10},
	}
	md := Markdown(scenarios, results, "")
	pressure, calm, _ := strings.Cut(md[strings.Index(md, "## pressure"):], "## calm")
	for _, want := range []string{"| prefix hit rate | preemptions |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
		"| idle-engine floor (reference) | 1 | — | 1.00 | 1.00 | 1.00 | — | — | — | — | — | — |\n",
		"| 0.0% | 120 |\n", "| 0.0% | 0 |\n", "| 0.0% | 50 (30–90) |\n", PreemptionsDefinition} {
		if !strings.Contains(pressure, want) {
			t.Errorf("no %q in the section with preemptions:\n%s", want, pressure)
		}
	}
	if strings.Contains(calm, "preemptions") || strings.Contains(calm, "Preemptions") {
		t.Errorf("a preemptions column where none preempted:\n%s", calm)
	}
}

func TestMarkdownOverTime(t *testing.T) {
	_, results := fleet() // 90 requests a policy, 89 successful under kvgate
	md := Markdown([]Scenario{{Name: "demo"}}, results, "")
	for _, want := range []string{
		"![P95 TTFT over time, demo](plots/demo-ttft-over-time.svg)",
		"cut into 4 windows of consecutive requests",
		"(22–24 of them, never fewer than 20)", // 89 successful kvgate requests cut the windows
	} {
		t.Run(want, func(t *testing.T) {
			if !strings.Contains(md, want) {
				t.Fatalf("no %q in\n%s", want, md)
			}
		})
	}
}

func TestMarkdownTitle(t *testing.T) {
	for _, tc := range []struct {
		name, header, want string
	}{
		{"default", "`kvgate bench`.", "# kvgate bench\n\n`kvgate bench`.\n\n"},
		{"none", "", "# kvgate bench\n\nPercentiles are"},
		{"the header's own", "# kvgate demo\n\nCommand: `kvgate demo`.", "# kvgate demo\n\nCommand: `kvgate demo`.\n\nPercentiles are"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if md := Markdown(nil, nil, tc.header); !strings.HasPrefix(md, tc.want) {
				t.Fatalf("report starts %.80q, want %q", md, tc.want)
			}
		})
	}
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
