package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// label names a row's policy in a table: the oracle as the reference it is, a
// policy run in draws with how many its figures are the median of, and a run
// that never drained as unstable.
func label(r row) string {
	s := r.Policy
	var notes []string
	if r.Policy == Reference {
		notes = append(notes, "reference")
	}
	if r.drawn() {
		notes = append(notes, drawsNote(r))
	}
	if r.Unstable {
		notes = append(notes, "unstable")
	}
	if len(notes) > 0 {
		s += " (" + strings.Join(notes, ", ") + ")"
	}
	return s
}

// drawsNote says what a drawn row's figures are the median of.
func drawsNote(r row) string {
	if len(r.pool) == len(r.draws) {
		return fmt.Sprintf("median of %d draws", len(r.draws))
	}
	return fmt.Sprintf("median of the %d of %d draws that drained", len(r.pool), len(r.draws))
}

// bound writes a latency of a run that never drained as the lower bound it is.
func bound(v string, unstable bool) string {
	if unstable {
		return "≥ " + v
	}
	return v
}

// fmtLatency writes a latency in prose with its unit: ms below a second, else s.
func fmtLatency(v float64) string {
	switch {
	case v < 1000:
		return fmtMS(v) + " ms"
	case v < 100_000:
		return strconv.FormatFloat(v/1000, 'f', 2, 64) + " s"
	default:
		return strconv.FormatFloat(v/1000, 'f', 0, 64) + " s"
	}
}

// versus formats the change of v (unstable when its run never drained) against
// base (baseUnstable likewise, named baseName). An unstable run's latency is a
// lower bound, so the change of a latency is then a bound: at most the figure
// against an unstable baseline, at least it for an unstable policy, nothing
// when both are. A throughput's change is only flagged. With baseName "" the
// flag is left to the caller, the bound's sign kept.
func versus(v, base float64, unstable, baseUnstable bool, baseName string, latency bool) string {
	c := formatChange(Change(v, base))
	if c == "n/a" {
		return c
	}
	flag := func(s, what string) string {
		if baseName == "" {
			return s
		}
		return s + " (" + what + ")"
	}
	switch {
	case unstable && baseUnstable && latency:
		return flag("n/a", "both unstable")
	case unstable && baseUnstable:
		return flag(c, "both unstable")
	case baseUnstable && latency:
		return flag("≤ "+c, baseName+" unstable")
	case baseUnstable:
		return flag(c, baseName+" unstable")
	case unstable && latency:
		return flag("≥ "+c, "unstable")
	case unstable:
		return flag(c, "unstable")
	}
	return c
}

// drained says, after a run's figures in prose, that it never drained.
func drained(unstable bool) string {
	if unstable {
		return ", never drained"
	}
	return ""
}

// policiesList lists the policies the results compare, in order of first
// appearance, each with its description when there is one.
func policiesList(b *strings.Builder, results []Result, descriptions map[string]string) {
	var seen []string
	for _, r := range results {
		if !slices.Contains(seen, r.Policy) {
			seen = append(seen, r.Policy)
		}
	}
	if len(seen) == 0 {
		return
	}
	b.WriteString("## Policies\n\n")
	for _, p := range seen {
		name := "**" + cell(p) + "**"
		if p == Reference {
			name += " (reference, not a competitor)"
		}
		if d := strings.TrimSpace(descriptions[p]); d != "" {
			fmt.Fprintf(b, "- %s: %s\n", name, d)
		} else {
			fmt.Fprintf(b, "- %s\n", name)
		}
	}
	b.WriteString("\n")
}

// headlineAgainst are the policies a headline compares Subject with: the
// reference, then the baselines.
func headlineAgainst() []string { return append([]string{Reference}, HeadlineBaselines...) }

// against names a headline's comparison policy for a reader.
func against(r row, ran bool, policy string) string {
	switch {
	case policy == Reference:
		return "the oracle (reference: it sees exact engine state)"
	case policy == "round-robin":
		return "round-robin (per request)"
	case ran && r.drawn():
		return policy + " (" + drawsNote(r) + ")"
	}
	return policy
}

// headline writes a scenario's headline: Subject against the oracle, then
// against each baseline users run, at P95 and P99, each line naming its
// baseline.
func headline(b *strings.Builder, s section) {
	me, ok := s.row(Subject)
	if !ok {
		fmt.Fprintf(b, "**Headline:** %s was not run.\n\n", Subject)
		return
	}
	b.WriteString("**Headline** (TTFT P95 / P99):\n\n")
	if me.Unstable {
		fmt.Fprintf(b, "- %s **never drained** (unstable): P95 %s, P99 %s\n", Subject,
			bound(fmtLatency(me.TTFTP95ms), true), bound(fmtLatency(me.TTFTP99ms), true))
	}
	for _, p := range headlineAgainst() {
		r, ran := s.row(p)
		name := against(r, ran, p)
		if !ran {
			fmt.Fprintf(b, "- %s against %s: not run\n", Subject, name)
			continue
		}
		fmt.Fprintf(b, "- %s against %s: P95 %s, P99 %s (%s %s / %s%s; %s %s / %s%s)\n", Subject, name,
			versus(me.TTFTP95ms, r.TTFTP95ms, me.Unstable, r.Unstable, "", true),
			versus(me.TTFTP99ms, r.TTFTP99ms, me.Unstable, r.Unstable, "", true),
			Subject, bound(fmtLatency(me.TTFTP95ms), me.Unstable), bound(fmtLatency(me.TTFTP99ms), me.Unstable), drained(me.Unstable),
			p, bound(fmtLatency(r.TTFTP95ms), r.Unstable), bound(fmtLatency(r.TTFTP99ms), r.Unstable), drained(r.Unstable))
	}
	b.WriteString("\n")
}

// overview is the report's headline table: per scenario the floor, the
// oracle's and Subject's P95 TTFT, Subject's change against each policy of
// the headline that any scenario ran, and its targets' verdicts.
func overview(b *strings.Builder, secs []section) {
	var cols []string
	for _, p := range headlineAgainst() {
		if slices.ContainsFunc(secs, func(s section) bool { _, ok := s.row(p); return ok }) {
			cols = append(cols, p)
		}
	}
	if !slices.ContainsFunc(secs, func(s section) bool { _, ok := s.row(Subject); return ok }) {
		return
	}
	fmt.Fprintf(b, "## Headline\n\nP95 TTFT of %s per scenario, against the idle-engine floor, the oracle (a reference, not a competitor) and what users run instead; a change marked ≤ or ≥ is a bound against a run whose queue never drained.\n\n", Subject)
	b.WriteString("| scenario | floor | " + Subject)
	align := "|---|--:|--:|"
	for _, p := range cols {
		fmt.Fprintf(b, " | vs %s", cell(p))
		align += "--:|"
	}
	b.WriteString(" | target |\n" + align + "---|\n")
	for _, s := range secs {
		me, ok := s.row(Subject)
		if !ok {
			continue
		}
		floor := "—"
		if s.Floor != nil {
			floor = fmtLatency(s.Floor.P95ms)
		}
		fmt.Fprintf(b, "| %s | %s | %s", cell(s.Name), floor, bound(fmtLatency(me.TTFTP95ms), me.Unstable))
		for _, p := range cols {
			r, ran := s.row(p)
			if !ran {
				b.WriteString(" | not run")
				continue
			}
			fmt.Fprintf(b, " | %s", cell(versus(me.TTFTP95ms, r.TTFTP95ms, me.Unstable, r.Unstable, p, true)))
		}
		var verdicts []string
		for _, g := range s.Goals {
			v, _ := s.assess(g)
			what := fmt.Sprintf("P%d", g.Percentile)
			if g.Against != "" && g.Against != s.baseline() {
				what += " vs " + g.Against
			}
			verdicts = append(verdicts, what+" "+v)
		}
		t := strings.Join(verdicts, ", ")
		if t == "" {
			t = "–"
		}
		fmt.Fprintf(b, " | %s |\n", t)
	}
	b.WriteString("\n")
}

// Verdicts on a goal.
const (
	met           = "met"
	notMet        = "not met"
	infeasible    = "infeasible"
	notAssessable = "not assessable"
)

// formatGoal writes a goal: "P95 ≤ −97% against round-robin".
func (s section) formatGoal(g Goal) string {
	c := strconv.FormatFloat(math.Abs(g.Change), 'f', -1, 64) + "%"
	switch {
	case g.Change < 0:
		c = "−" + c
	case g.Change > 0:
		c = "+" + c
	}
	who := ""
	if g.Policy != "" && g.Policy != Subject {
		who = g.Policy + "'s "
	}
	if g.Change == 0 {
		return fmt.Sprintf("%sP%d no higher than %s's", who, g.Percentile, s.goalBase(g))
	}
	return fmt.Sprintf("%sP%d ≤ %s against %s", who, g.Percentile, c, s.goalBase(g))
}

func (s section) goalBase(g Goal) string {
	if g.Against != "" {
		return g.Against
	}
	return s.baseline()
}

// assess judges a goal: infeasible when the TTFT it asks for is below the
// floor; not assessable when the baseline, or the policy judged, never drained
// or was not run; else met or not. why says so with the figures.
func (s section) assess(g Goal) (verdict, why string) {
	policy := g.Policy
	if policy == "" {
		policy = Subject
	}
	baseName := s.goalBase(g)
	base, okBase := s.row(baseName)
	me, okMe := s.row(policy)
	switch {
	case !okBase:
		return notAssessable, baseName + " was not run"
	case !okMe:
		return notAssessable, policy + " was not run"
	}
	pick := func(r Result) float64 {
		switch g.Percentile {
		case 50:
			return r.TTFTP50ms
		case 99:
			return r.TTFTP99ms
		}
		return r.TTFTP95ms
	}
	bv, mv := pick(base.Result), pick(me.Result)
	change := versus(mv, bv, me.Unstable, base.Unstable, "", true)
	if base.Unstable {
		return notAssessable, fmt.Sprintf("%s never drained, so its P%d (%s) and the target with it grow with the trace (%s: %s)",
			baseName, g.Percentile, bound(fmtLatency(bv), true), policy, change)
	}
	want := bv * (1 + g.Change/100)
	if s.Floor != nil {
		if floor, ok := s.Floor.at(g.Percentile); ok && want < floor {
			return infeasible, fmt.Sprintf("it asks for P%d ≤ %s, below the idle-engine floor of %s (%s: %s, %s)",
				g.Percentile, fmtLatency(want), fmtLatency(floor), policy, change, fmtLatency(mv))
		}
	}
	if me.Unstable {
		return notMet, fmt.Sprintf("%s never drained (P%d %s)", policy, g.Percentile, bound(fmtLatency(mv), true))
	}
	c, _ := Change(mv, bv)
	if c <= g.Change {
		return met, fmt.Sprintf("%s: %s, %s against %s", policy, change, fmtLatency(mv), fmtLatency(bv))
	}
	return notMet, fmt.Sprintf("%s: %s, %s against %s; the target asks for %s", policy, change, fmtLatency(mv), fmtLatency(bv), fmtLatency(want))
}

// targets writes the scenario's target and, per goal, its verdict.
func targets(b *strings.Builder, s section) {
	if s.Target == "" && len(s.Goals) == 0 {
		return
	}
	if s.Target != "" {
		fmt.Fprintf(b, "**Target:** %s\n\n", s.Target)
	}
	if len(s.results) == 0 {
		return
	}
	for _, g := range s.Goals {
		v, why := s.assess(g)
		if v == infeasible || v == met {
			v = "**" + v + "**"
		}
		fmt.Fprintf(b, "- %s: %s: %s\n", s.formatGoal(g), v, why)
	}
	if len(s.Goals) > 0 {
		b.WriteString("\n")
	}
}

// floorLine states the scenario's idle-engine floor.
func floorLine(b *strings.Builder, s section) {
	f := s.Floor
	if f == nil {
		return
	}
	fmt.Fprintf(b, "**Idle-engine floor** (TTFT P50 / P95 / P99, over %d requests): %s / %s / %s", f.Requests,
		fmtLatency(f.P50ms), fmtLatency(f.P95ms), fmtLatency(f.P99ms))
	if f.ColdP50ms == f.P50ms && f.ColdP95ms == f.P95ms && f.ColdP99ms == f.P99ms {
		b.WriteString("; the same without a prefix cache.\n\n")
		return
	}
	fmt.Fprintf(b, "; without a prefix cache %s / %s / %s (the floor finds %.1f%% of prompt tokens cached).\n\n",
		fmtLatency(f.ColdP50ms), fmtLatency(f.ColdP95ms), fmtLatency(f.ColdP99ms), 100*f.CachedShare)
}
