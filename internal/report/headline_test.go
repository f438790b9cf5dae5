package report

import (
	"strings"
	"testing"
)

// headlineFixture is a scenario run under every headline policy but
// weighted-round-robin: kube-proxy in five draws, one of which never drained;
// round-robin never drained; and a floor that makes the P99 goal infeasible.
func headlineFixture() ([]Scenario, []Result) {
	sc := []Scenario{{Name: "mixed", Description: "A mixed fleet.", Target: "P95 ≤ −90% and P99 ≤ −98% against least-request",
		Baseline: "least-request",
		Goals:    []Goal{{Percentile: 95, Change: -90}, {Percentile: 99, Change: -98}, {Percentile: 95, Change: -50, Against: "round-robin"}},
		Floor:    &Floor{P50ms: 10, P95ms: 40, P99ms: 80, ColdP50ms: 10, ColdP95ms: 40, ColdP99ms: 80, Requests: 1000}}}
	return sc, []Result{
		res("round-robin", 0, 877_000, 956_000, true),
		res("least-request", 0, 1000, 2000, false),
		res("kube-proxy", 1, 3000, 5000, false),
		res("kube-proxy", 2, 2000, 4000, false),
		res("kube-proxy", 3, 500_000, 600_000, true),
		res("kube-proxy", 4, 4000, 6000, false),
		res("kube-proxy", 5, 1000, 3000, false),
		res("gie-default", 0, 200, 700, false),
		res("oracle", 0, 50, 90, false),
		res("kvgate", 0, 88, 250, false),
	}
}

// res is a result of scenario "mixed" with the given TTFT P95 and P99.
func res(policy string, draw int, p95, p99 float64, unstable bool) Result {
	r := Result{Scenario: "mixed", Policy: policy, Draw: draw, Mode: "sim", Requests: 1000, TTFTP50ms: p95 / 4, TTFTP95ms: p95, TTFTP99ms: p99,
		OutputTokensPerS: 1000 - p95/1000, Unstable: unstable}
	if unstable {
		r.Drain = &Drain{LastTenthP95ms: 10 * p95, SecondTenthP95ms: p95, ArrivalSpanS: 100}
	}
	return r
}

func TestRows(t *testing.T) {
	_, results := headlineFixture()
	s := sections(nil, results)[0]
	t.Run("one per policy, in order", func(t *testing.T) {
		var got []string
		for _, r := range s.rows() {
			got = append(got, r.Policy)
		}
		if strings.Join(got, ",") != "round-robin,least-request,kube-proxy,gie-default,oracle,kvgate" {
			t.Fatal(got)
		}
	})
	for _, tc := range []struct {
		name            string
		draws           []Result
		p95, lo, hi     float64
		pool, undrained int
		unstable        bool
		plottedDraw     int
		drawn           bool
	}{
		{"a policy run once", []Result{res("p", 0, 7, 9, false)}, 7, 7, 7, 1, 0, false, 0, false},
		{"one run that never drained", []Result{res("p", 0, 7000, 9000, true)}, 7000, 7000, 7000, 1, 0, true, 0, false},
		{"five draws, one undrained left out: the median of four is the lower middle", headlineFixture2(), 2000, 1000, 4000, 4, 1, false, 2, true},
		{"three draws, none drained: the row is unstable", []Result{res("p", 1, 9e5, 1e6, true), res("p", 2, 7e5, 1e6, true), res("p", 3, 8e5, 1e6, true)},
			8e5, 7e5, 9e5, 3, 0, true, 3, true},
		{"two draws", []Result{res("p", 1, 30, 40, false), res("p", 2, 10, 20, false)}, 10, 10, 30, 2, 0, false, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRow(tc.draws)
			if r.TTFTP95ms != tc.p95 || r.lo.TTFTP95ms != tc.lo || r.hi.TTFTP95ms != tc.hi || len(r.pool) != tc.pool ||
				len(r.undrained()) != tc.undrained || r.Unstable != tc.unstable || r.plotted.Draw != tc.plottedDraw || r.drawn() != tc.drawn {
				t.Fatalf("row: p95 %g (%g–%g), pool %d, undrained %d, unstable %v, plotted draw %d, drawn %v",
					r.TTFTP95ms, r.lo.TTFTP95ms, r.hi.TTFTP95ms, len(r.pool), len(r.undrained()), r.Unstable, r.plotted.Draw, r.drawn())
			}
			if r.drawn() && r.Draw != 0 {
				t.Fatalf("the median row carries draw %d", r.Draw)
			}
		})
	}
}

// headlineFixture2 is the fixture's kube-proxy draws.
func headlineFixture2() []Result {
	_, results := headlineFixture()
	var out []Result
	for _, r := range results {
		if r.Policy == "kube-proxy" {
			out = append(out, r)
		}
	}
	return out
}

func TestVersus(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		v, base                float64
		unstable, baseUnstable bool
		latency                bool
		want                   string
	}{
		{"both drained", 50, 100, false, false, true, "−50.0%"},
		{"against an unstable baseline the change is at most this", 50, 100, false, true, true, "≤ −50.0% (rr unstable)"},
		{"an unstable policy's change is at least this", 150, 100, true, false, true, "≥ +50.0% (unstable)"},
		{"both unstable: no change at all", 150, 100, true, true, true, "n/a (both unstable)"},
		{"a throughput is only flagged", 150, 100, false, true, false, "+50.0% (rr unstable)"},
		{"no baseline figure", 1, 0, false, false, true, "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versus(tc.v, tc.base, tc.unstable, tc.baseUnstable, "rr", tc.latency); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAssess(t *testing.T) {
	floor := &Floor{P50ms: 10, P95ms: 40, P99ms: 80}
	base := res("round-robin", 0, 1000, 2000, false)
	for _, tc := range []struct {
		name    string
		goal    Goal
		results []Result
		floor   *Floor
		want    string
		why     string
	}{
		{"met", Goal{Percentile: 95, Change: -90}, []Result{base, res("kvgate", 0, 90, 300, false)}, floor, met, "−91.0%"},
		{"not met", Goal{Percentile: 95, Change: -95}, []Result{base, res("kvgate", 0, 90, 300, false)}, floor, notMet, "asks for 50.0 ms"},
		{"infeasible: below the floor", Goal{Percentile: 99, Change: -98}, []Result{base, res("kvgate", 0, 90, 300, false)}, floor, infeasible,
			"P99 ≤ 40.0 ms, below the idle-engine floor of 80.0 ms"},
		{"without a floor, only met or not", Goal{Percentile: 99, Change: -98}, []Result{base, res("kvgate", 0, 90, 300, false)}, nil, notMet, ""},
		{"a baseline that never drained", Goal{Percentile: 95, Change: -97}, []Result{res("round-robin", 0, 877_000, 956_000, true), res("kvgate", 0, 90, 300, false)},
			floor, notAssessable, "round-robin never drained"},
		{"a judged policy that never drained", Goal{Percentile: 95, Change: 5}, []Result{base, res("kvgate", 0, 9000, 9000, true)}, floor, notMet, "kvgate never drained"},
		{"another policy judged", Goal{Percentile: 95, Change: -50, Policy: "gie-default"}, []Result{base, res("gie-default", 0, 400, 900, false)}, floor, met, "gie-default: −60.0%"},
		{"the baseline not run", Goal{Percentile: 95, Change: -50}, []Result{res("kvgate", 0, 90, 300, false)}, floor, notAssessable, "round-robin was not run"},
		{"against another baseline", Goal{Percentile: 95, Change: 0, Against: "least-request"}, []Result{base, res("least-request", 0, 80, 90, false),
			res("kvgate", 0, 90, 300, false)}, floor, notMet, "+12.5%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sections([]Scenario{{Name: "mixed", Floor: tc.floor}}, tc.results)[0]
			v, why := s.assess(tc.goal)
			if v != tc.want || !strings.Contains(why, tc.why) {
				t.Fatalf("%s: %s, want %s: …%s…", v, why, tc.want, tc.why)
			}
		})
	}
}

func TestMarkdownHeadline(t *testing.T) {
	scenarios, results := headlineFixture()
	md := MarkdownDoc(scenarios, results, Doc{Header: "h", Policies: map[string]string{
		"kvgate": "kvgate's default profile.", "oracle": "Sees exact engine state.", "kube-proxy": "A random pod per connection."}})
	for _, tc := range []struct {
		name, want string
	}{
		{"definitions", "A run is **unstable**"},
		{"floor definition", "The **idle-engine floor** is"},
		{"draws definition", "A policy run in several draws"},
		{"a policy's description", "- **kube-proxy**: A random pod per connection."},
		{"the oracle listed as a reference", "- **oracle** (reference, not a competitor): Sees exact engine state."},
		{"a policy without a description", "- **gie-default**\n"},
		{"overview row", "| mixed | 40.0 ms | 88.0 ms | +76.0% | −95.6% | ≤ −99.99% (round-robin unstable) | −91.2% | −56.0% | P95 met, P99 infeasible, P95 vs round-robin not assessable |"},
		{"overview leaves out what no scenario ran", "vs weighted-round-robin"},
		{"a met goal", "- P95 ≤ −90% against least-request: **met**: kvgate: −91.2%, 88.0 ms against 1.00 s"},
		{"an infeasible goal, with the floor", "- P99 ≤ −98% against least-request: **infeasible**: it asks for P99 ≤ 40.0 ms, below the idle-engine floor of 80.0 ms"},
		{"a goal against a queue that never drained", "- P95 ≤ −50% against round-robin: not assessable: round-robin never drained, so its P95 (≥ 877 s)"},
		{"floor line", "**Idle-engine floor** (TTFT P50 / P95 / P99, over 1000 requests): 10.0 ms / 40.0 ms / 80.0 ms; the same without a prefix cache."},
		{"headline: the oracle first", "**Headline** (TTFT P95 / P99):\n\n- kvgate against the oracle (reference: it sees exact engine state): P95 +76.0%, P99 +177.8%"},
		{"headline: kube-proxy's median", "- kvgate against kube-proxy (median of the 4 of 5 draws that drained): P95 −95.6%, P99 −93.8% (kvgate 88.0 ms / 250.0 ms; kube-proxy 2.00 s / 4.00 s)"},
		{"headline: an unstable baseline bounds the change", "- kvgate against round-robin (per request): P95 ≤ −99.99%, P99 ≤ −99.97% (kvgate 88.0 ms / 250.0 ms; round-robin ≥ 877 s / ≥ 956 s, never drained)"},
		{"headline: a policy not run", "- kvgate against weighted-round-robin: not run"},
		{"floor row", "| idle-engine floor (reference) | 1000 | — | 10.0 | 40.0 | 80.0 | — |"},
		{"unstable row as lower bounds", "| round-robin (unstable) | 1000 | 0 | ≥ 219250.0 | ≥ 877000.0 | ≥ 956000.0 |"},
		{"draws: median and range", "| kube-proxy (median of the 4 of 5 draws that drained) | 1000 | 0 | 500.0 (250.0–1000.0) | 2000.0 (1000.0–4000.0) | 4000.0 (3000.0–6000.0) |"},
		{"draws that never drained, apart", "| kube-proxy: the 1 of 5 draws that never drained (median, unstable) | 1000 | 0 | ≥ 125000.0 | ≥ 500000.0 |"},
		{"the oracle a reference in the numbers", "| oracle (reference) | 1000 | 0 | 12.5 | 50.0 |"},
		{"the oracle a reference in the changes", "| oracle (reference) | −95.0% | −95.5% |"},
		{"never drained, said", "**Never drained** (unstable: latencies are lower bounds, ≥): round-robin (P95 TTFT of the last tenth of arrivals 8770 s, of the second tenth 877 s, arrivals spanning 100 s); kube-proxy: 1 of 5 draws."},
		{"an unstable policy's change is a bound", "| round-robin (unstable) | ≥ +87600.0% (unstable) |"},
		{"a drawn policy's change with its range", "| kube-proxy (median of the 4 of 5 draws that drained) | +100.0% (0.0% to +300.0%) |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if has := strings.Contains(md, tc.want); has == (tc.name == "overview leaves out what no scenario ran") {
				t.Fatalf("contains %q: %v; report:\n%s", tc.want, has, md)
			}
		})
	}
	t.Run("order", func(t *testing.T) {
		last := -1
		for _, s := range []string{"## Policies", "## Headline", "## mixed", "**Target:**", "**Idle-engine floor**", "**Headline**", "| policy |", "Change against"} {
			at := strings.Index(md, s)
			if at <= last {
				t.Fatalf("%q at %d, not after %d:\n%s", s, at, last, md)
			}
			last = at
		}
	})
	t.Run("summary", func(t *testing.T) {
		var b strings.Builder
		Summary(&b, scenarios, results)
		for _, want := range []string{"idle-engine floor", "kube-proxy (median of the 4 of 5 draws that drained)", "≥ 877000.0", "oracle (reference)", "≥ +87600.0% (unstable)"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("no %q in\n%s", want, b.String())
			}
		}
	})
}

func TestFormatGoal(t *testing.T) {
	s := section{Scenario: Scenario{Name: "s"}}
	for _, tc := range []struct {
		goal Goal
		want string
	}{
		{Goal{Percentile: 95, Change: -97}, "P95 ≤ −97% against round-robin"},
		{Goal{Percentile: 99, Change: 5, Against: "least-request"}, "P99 ≤ +5% against least-request"},
		{Goal{Percentile: 95, Against: "gie-default"}, "P95 no higher than gie-default's"},
		{Goal{Percentile: 95, Change: -12.5, Policy: "chat"}, "chat's P95 ≤ −12.5% against round-robin"},
	} {
		if got := s.formatGoal(tc.goal); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.goal, got, tc.want)
		}
	}
}

// A floor below the cold one says how much of the prompts it found cached.
func TestFloorLine(t *testing.T) {
	var b strings.Builder
	floorLine(&b, section{Scenario: Scenario{Floor: &Floor{P50ms: 9.2, P95ms: 20.4, P99ms: 30.6, ColdP50ms: 284.1, ColdP95ms: 295, ColdP99ms: 303.2,
		Requests: 30000, CachedShare: 0.966}}})
	want := "**Idle-engine floor** (TTFT P50 / P95 / P99, over 30000 requests): 9.20 ms / 20.4 ms / 30.6 ms; without a prefix cache 284.1 ms / 295.0 ms / 303.2 ms (the floor finds 96.6% of prompt tokens cached).\n\n"
	if b.String() != want {
		t.Fatalf("%q\nwant %q", b.String(), want)
	}
}

// A drawn policy's change comes with the range over its draws, unless the
// change itself is a bound or none.
func TestChangesOfDraws(t *testing.T) {
	drawn := newRow([]Result{res("kube-proxy", 0, 2000, 3000, false), res("kube-proxy", 1, 1000, 2000, false), res("kube-proxy", 2, 3000, 4000, false)})
	undrained := newRow([]Result{res("kube-proxy", 0, 9e5, 1e6, true), res("kube-proxy", 1, 8e5, 1e6, true)})
	stable, unstable := newRow([]Result{res("round-robin", 0, 1000, 2000, false)}), newRow([]Result{res("round-robin", 0, 7e5, 8e5, true)})
	for _, tc := range []struct {
		name      string
		r, base   row
		p95, tput string
	}{
		{"both drained", drawn, stable, "+100.0% (0.0% to +200.0%)", "−0.1% (−0.2% to 0.0%)"},
		{"against a baseline that never drained", drawn, unstable, "≤ −99.71% (round-robin unstable)", "+232.7% (round-robin unstable) (+232.3% to +233.0%)"},
		{"both never drained", undrained, unstable, "n/a (both unstable)", "−66.7% (both unstable) (−66.7% to −33.3%)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p95, _, tput := changes(tc.r, tc.base, true)
			if p95 != tc.p95 || tput != tc.tput {
				t.Fatalf("p95 %q, throughput %q; want %q, %q", p95, tput, tc.p95, tc.tput)
			}
		})
	}
}
