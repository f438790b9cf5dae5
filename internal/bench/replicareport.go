package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/peers"
	"github.com/kvgate/kvgate/internal/report"
)

// The replicas suite's goal at the most replicas with shared state.
const (
	goalHitRatio = 0.95 // of one replica's prefix hit rate, at least
	goalP95      = 10.0 // % over one replica's P95 TTFT, at most
)

// replicasDoc renders the replicas suite's results.
type replicasDoc struct {
	cfg       Config
	scenarios []Scenario
	results   []ReplicaResult
	took      time.Duration
}

// find returns the run of scenario routed as v (its part aside).
func (d replicasDoc) find(scenario string, v replicaVariant) (ReplicaResult, bool) {
	for _, r := range d.results {
		rv := r.variant()
		rv.part = v.part
		if r.Scenario == scenario && rv == v {
			return r, true
		}
	}
	return ReplicaResult{}, false
}

// one is the policy's run at one replica, what the others are measured against.
func (d replicasDoc) one(scenario, policy string) (ReplicaResult, bool) {
	return d.find(scenario, replicaVariant{policy: policy, replicas: 1})
}

// mostReplicas is the largest replica count the suite ran.
func (d replicasDoc) mostReplicas() int {
	n := 1
	for _, r := range d.results {
		n = max(n, r.Replicas)
	}
	return n
}

func (d replicasDoc) policies() []string {
	if len(d.cfg.Policies) > 0 {
		return d.cfg.Policies
	}
	return []string{replicasPolicy}
}

// configured is the sharing the command asked for, at n replicas.
func (d replicasDoc) configured(policy string, n int) replicaVariant {
	return replicaVariant{policy: policy, replicas: n, shared: true, delay: d.cfg.SyncDelay, every: d.cfg.SyncEvery}
}

// summary is the table printed when the suite ends.
func (d replicasDoc) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-17s %-34s %9s %10s %10s %10s %12s\n", "scenario", "routing", "hit rate", "p50 ms", "p95 ms", "p99 ms", "max/endpoint")
	for _, s := range d.scenarios {
		for _, r := range d.results {
			if r.Scenario == s.Name {
				fmt.Fprintf(&b, "%-17s %-34s %8.1f%% %10.1f %10.1f %10.1f %12d\n", s.Name, r.variant().String(), 100*r.PrefixHitRate,
					r.TTFTP50ms, r.TTFTP95ms, r.TTFTP99ms, r.MaxInFlight)
			}
		}
	}
	return b.String()
}

// markdown is report.md.
func (d replicasDoc) markdown() string {
	var b strings.Builder
	most := d.mostReplicas()
	b.WriteString("# kvgate bench: gateway replicas, with and without shared state\n\n")
	fmt.Fprintf(&b, "Command: `%s`. Seed %d. %d runs in %.1f s. Generated %s.\n\n", d.cfg.CommandLine, d.cfg.Seed, len(d.results),
		d.took.Seconds(), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "Each scenario's trace, in virtual time, behind R gateway replicas. Each replica has its own "+
		"routing core (`%s`'s picker, prefix index, dispatch accounting per endpoint) and reads the same scrapes (every 50 ms). "+
		"Clients are spread as a Kubernetes Service spreads connections: a request that names a client (shared-prefix's users) "+
		"goes to the replica its client hashes to, any other to a replica drawn at random. **Unshared**, a replica knows only "+
		"the requests it routed. **Shared**, each also applies its peers' state: their decisions, recorded in its prefix index "+
		"%v after they were sent, and their loads on each endpoint since its last scrape (dispatches, first tokens, "+
		"completions, prompts awaiting a first token), which each replica publishes %s and the others receive %v later, "+
		"and what each answer taught a replica of its endpoint's speed (predictedLatency), as late. Error rates and sessions "+
		"stay each replica's own. Max in "+
		"flight counts each endpoint's requests from their pick to their end, from all replicas at once.\n\n",
		strings.Join(d.policies(), "`, `"), d.cfg.SyncDelay, publishing(d.cfg.SyncEvery), d.cfg.SyncDelay)
	d.goals(&b, most)
	for _, s := range d.scenarios {
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", s.Name, s.Description)
		for _, p := range d.policies() {
			d.replicasTable(&b, s.Name, p)
		}
		d.delayTable(&b, s.Name, most)
		d.speedTable(&b, s.Name, most)
	}
	return b.String()
}

// goals is the headline: the goal at the most replicas, scenario by
// scenario.
func (d replicasDoc) goals(b *strings.Builder, most int) {
	p := d.policies()[0]
	fmt.Fprintf(b, "## At %d replicas\n\n", most)
	fmt.Fprintf(b, "`%s` against one replica. Goal with shared state: a prefix hit rate at least %.2f× one replica's and P95 TTFT "+
		"within +%.0f%% of it.\n\n", p, goalHitRatio, goalP95)
	b.WriteString("| scenario | one replica: hit rate, P95 | hit rate, shared | unshared | TTFT P95, shared | shared at once | unshared | goal |\n" +
		"|---|--:|--:|--:|--:|--:|--:|---|\n")
	for _, s := range d.scenarios {
		one, ok1 := d.one(s.Name, p)
		sh, ok2 := d.find(s.Name, d.configured(p, most))
		own, ok3 := d.find(s.Name, replicaVariant{policy: p, replicas: most})
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		ideal := "—"
		if r, ok := d.find(s.Name, replicaVariant{policy: p, replicas: most, shared: true}); ok {
			ideal = latVs(r.TTFTP95ms, one.TTFTP95ms, r.Unstable)
		}
		fmt.Fprintf(b, "| %s | %s, %s | %s | %s | %s | %s | %s | %s |\n", s.Name, hitRate(one), fmtLat(one.TTFTP95ms, one.Unstable),
			hitVs(sh, one), hitVs(own, one), latVs(sh.TTFTP95ms, one.TTFTP95ms, sh.Unstable), ideal,
			latVs(own.TTFTP95ms, one.TTFTP95ms, own.Unstable), verdict(sh, one))
	}
	b.WriteString("\n\"Shared at once\": no delay, each change published as it happens, the best sharing can do; what it leaves of " +
		"the gap to one replica is what the replicas do not share.\n\n")
}

// verdict says whether a shared run meets the goal against one replica, and
// by how much it misses.
func verdict(sh, one ReplicaResult) string {
	var missed []string
	if one.PrefixHitRate > 0 {
		if r := sh.PrefixHitRate / one.PrefixHitRate; r < goalHitRatio {
			missed = append(missed, fmt.Sprintf("hit rate %.2f× (goal ≥ %.2f×)", r, goalHitRatio))
		}
	}
	if c, ok := report.Change(sh.TTFTP95ms, one.TTFTP95ms); ok && c > goalP95 {
		missed = append(missed, fmt.Sprintf("P95 %s (goal ≤ +%.0f%%): %.1f points over", pct(c), goalP95, c-goalP95))
	}
	if sh.Unstable {
		missed = append(missed, "queue never drains")
	}
	if len(missed) == 0 {
		return "met"
	}
	return "**missed**: " + strings.Join(missed, "; ")
}

// replicasTable is a policy's figures at each replica count, unshared and
// shared as configured, against one replica.
func (d replicasDoc) replicasTable(b *strings.Builder, scenario, policy string) {
	one, ok := d.one(scenario, policy)
	if !ok {
		return
	}
	fmt.Fprintf(b, "`%s`, against one replica (shared: %v late, loads published %s):\n\n", policy, d.cfg.SyncDelay, publishing(d.cfg.SyncEvery))
	header(b)
	counts := d.cfg.Replicas
	if len(counts) == 0 {
		counts = DefaultReplicas
	}
	for _, n := range counts {
		for _, shared := range []bool{false, true} {
			v := replicaVariant{policy: policy, replicas: n}
			if shared {
				if n == 1 {
					continue
				}
				v = d.configured(policy, n)
			}
			if r, ok := d.find(scenario, v); ok {
				state := "unshared"
				switch {
				case n == 1:
					state = "one replica"
				case shared:
					state = "shared"
				}
				row(b, strconv.Itoa(n), state, r, one)
			}
		}
	}
	if ref, ok := d.find(scenario, replicaVariant{policy: replicasReference, replicas: 1}); ok && policy != replicasReference {
		row(b, "1", "`"+replicasReference+"`, for reference", ref, one)
	}
	b.WriteString("\n")
}

// delayTable is the first policy at the most replicas, unshared and shared at
// every delay run.
func (d replicasDoc) delayTable(b *strings.Builder, scenario string, most int) {
	p := d.policies()[0]
	one, ok := d.one(scenario, p)
	if !ok || most == 1 {
		return
	}
	var shared []ReplicaResult
	for _, r := range d.results {
		if r.Scenario == scenario && r.Policy == p && r.Replicas == most && r.Shared {
			shared = append(shared, r)
		}
	}
	if len(shared) < 2 {
		return
	}
	slices.SortFunc(shared, func(a, c ReplicaResult) int {
		return cmp.Or(cmp.Compare(*a.SyncDelayMS, *c.SyncDelayMS), cmp.Compare(*a.SyncEveryMS, *c.SyncEveryMS))
	})
	fmt.Fprintf(b, "What the delay costs: `%s` at %d replicas, against one replica (\"each change\": loads published as they change, not periodically):\n\n", p, most)
	header(b)
	if own, ok := d.find(scenario, replicaVariant{policy: p, replicas: most}); ok {
		row(b, strconv.Itoa(most), "unshared", own, one)
	}
	for _, r := range shared {
		row(b, strconv.Itoa(most), sharing(r.variant()), r, one)
	}
	var within []string
	for _, r := range shared {
		if c, ok := report.Change(r.TTFTP95ms, one.TTFTP95ms); ok && c <= goalP95 {
			within = append(within, sharing(r.variant()))
		}
	}
	if len(within) == 0 {
		within = []string{"none of these"}
	}
	fmt.Fprintf(b, "\nP95 TTFT within +%.0f%% of one replica's: %s.\n\n", goalP95, strings.Join(within, "; "))
}

// speedTable compares, on a fleet of several GPU kinds, the default profile
// with chat-fixed-speed, which learns no speeds: what sharing at once leaves
// of the gap to one replica is then what the replicas do not share.
func (d replicasDoc) speedTable(b *strings.Builder, scenario string, most int) {
	p := d.policies()[0]
	fixedOne, ok := d.one(scenario, ChatFixedSpeed)
	if !ok {
		return
	}
	one, ok := d.one(scenario, p)
	if !ok {
		return
	}
	fmt.Fprintf(b, "What is not shared, the speeds each replica learns: `%s` against `%s` (which learns none), each against its own "+
		"one replica:\n\n", p, ChatFixedSpeed)
	header(b)
	for _, c := range []struct {
		policy string
		base   ReplicaResult
	}{{p, one}, {ChatFixedSpeed, fixedOne}} {
		for _, v := range []replicaVariant{{replicas: 1}, {replicas: most, shared: true}, d.configured(c.policy, most)} {
			v.policy = c.policy
			if r, ok := d.find(scenario, v); ok {
				row(b, strconv.Itoa(v.replicas), "`"+c.policy+"`, "+sharing(v), r, c.base)
			}
		}
	}
	b.WriteString("\n")
}

// sharing names how a run shares state.
func sharing(v replicaVariant) string {
	switch {
	case !v.shared && v.replicas == 1:
		return "one replica"
	case !v.shared:
		return "unshared"
	case v.delay == 0 && v.every == 0:
		return "shared at once"
	case v.every == 0:
		return fmt.Sprintf("shared %v late, each change", v.delay)
	}
	return fmt.Sprintf("shared %v late, every %v", v.delay, v.every)
}

// publishing says how often loads are published: every period, or as they
// change (0).
func publishing(every time.Duration) string {
	if every == 0 {
		return fmt.Sprintf("as they change (a change within %v of a replica's last send waits for the next, as the shared state's sender gathers them)", peers.DefaultFlush)
	}
	return fmt.Sprintf("every %v", every)
}

func header(b *strings.Builder) {
	b.WriteString("| replicas | state | prefix hit rate | TTFT P50 | TTFT P95 | TTFT P99 | max in flight | per endpoint |\n" +
		"|--:|---|--:|--:|--:|--:|--:|---|\n")
}

// row is one run's figures, each with its change against base unless it is
// base.
func row(b *strings.Builder, replicas, state string, r, base ReplicaResult) {
	same := r.variant() == base.variant()
	rel := func(v, o float64) string {
		if same {
			return fmtLat(v, r.Unstable)
		}
		return latVs(v, o, r.Unstable)
	}
	hit := hitVs(r, base)
	inflight := fmt.Sprintf("%d (%.2f×)", r.MaxInFlight, float64(r.MaxInFlight)/float64(max(base.MaxInFlight, 1)))
	if same {
		hit, inflight = hitRate(r), strconv.Itoa(r.MaxInFlight)
	}
	per := make([]string, len(r.MaxInFlightPerEndpoint))
	for i, n := range r.MaxInFlightPerEndpoint {
		per[i] = strconv.Itoa(n)
	}
	errs := ""
	if r.Errors > 0 {
		errs = fmt.Sprintf(" (%d errors)", r.Errors)
	}
	fmt.Fprintf(b, "| %s | %s%s | %s | %s | %s | %s | %s | %s |\n", replicas, state, errs, hit, rel(r.TTFTP50ms, base.TTFTP50ms),
		rel(r.TTFTP95ms, base.TTFTP95ms), rel(r.TTFTP99ms, base.TTFTP99ms), inflight, strings.Join(per, " · "))
}

// hitRate is a run's prefix hit rate, "—" when the trace shares no prefix
// (no run hits).
func hitRate(r ReplicaResult) string {
	if r.PrefixHitRate == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", 100*r.PrefixHitRate)
}

// hitVs is a run's hit rate and its ratio to base's.
func hitVs(r, base ReplicaResult) string {
	if base.PrefixHitRate == 0 {
		return hitRate(r)
	}
	return fmt.Sprintf("%s (%.2f×)", hitRate(r), r.PrefixHitRate/base.PrefixHitRate)
}

// latVs is a latency and its change against base.
func latVs(v, base float64, unstable bool) string {
	c, ok := report.Change(v, base)
	if !ok {
		return fmtLat(v, unstable)
	}
	return fmt.Sprintf("%s (%s)", fmtLat(v, unstable), pct(c))
}

func fmtLat(v float64, unstable bool) string {
	s := fmt.Sprintf("%.1f ms", v)
	if v >= 1000 {
		s = fmt.Sprintf("%.2f s", v/1000)
	}
	if unstable {
		s += " (unstable)"
	}
	return s
}

// pct formats a change in percent with its sign.
func pct(c float64) string {
	if c > -0.05 && c < 0.05 {
		return "±0%"
	}
	return strings.Replace(fmt.Sprintf("%+.1f%%", c), "-", "−", 1)
}
