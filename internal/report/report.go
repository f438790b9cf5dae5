// Package report turns a bench run's per-request records into what the run leaves
// behind: results.json for machines, report.md with SVG plots for people, and a
// short table for the terminal.
package report

import (
	"slices"
	"strings"
	"time"
)

// DefaultBaseline is the policy changes are measured against when a Scenario
// names none: the policy a gateway without kvgate would use.
const DefaultBaseline = "round-robin"

// Record is one request's outcome.
type Record struct {
	Arrival      time.Duration // from the start of the run
	TTFT         time.Duration // arrival to first token; 0 when Error
	E2E          time.Duration // arrival to last token
	OutputTokens int
	PromptTokens int
	CachedTokens int    // prompt tokens served from a prefix cache (0 when unknown)
	Endpoint     string // the server that answered, as Scenario.Servers names it; "" when unknown
	Error        bool
}

// Result is one scenario × policy, as results.json holds it.
type Result struct {
	Scenario string `json:"scenario"`
	Policy   string `json:"policy"`
	// Draw numbers the runs of a randomised policy (kube-proxy: which pod each
	// client's connection drew); the report shows their median and spread.
	Draw      int     `json:"draw,omitempty"`
	Mode      string  `json:"mode"` // "sim" or "live"
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"`
	TTFTP50ms float64 `json:"ttft_p50_ms"`
	TTFTP95ms float64 `json:"ttft_p95_ms"`
	TTFTP99ms float64 `json:"ttft_p99_ms"`
	// Inter-token latency: (E2E−TTFT)/(OutputTokens−1) per successful request with
	// at least two tokens; percentiles over requests.
	ITLP50ms         float64 `json:"itl_p50_ms"`
	ITLP95ms         float64 `json:"itl_p95_ms"`
	E2EP95ms         float64 `json:"e2e_p95_ms"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"` // successful requests' output tokens / DurationS
	PrefixHitRate    float64 `json:"prefix_hit_rate"`     // Σcached / Σprompt tokens of successful requests
	// Preemptions counts the sequences the engines preempted to free KV cache
	// (vLLM's num_preemptions); simulated runs only, 0 in live ones.
	Preemptions int     `json:"preemptions"`
	DurationS   float64 `json:"duration_s"` // first arrival to last completion
	// Unstable says the run's queue grew without draining (StabilityDefinition):
	// its latencies are lower bounds that grow with the trace. Drain holds what
	// the criterion read; nil when the run was too small to judge.
	Unstable bool   `json:"unstable,omitempty"`
	Drain    *Drain `json:"drain,omitempty"`
	// Records are kept for the plots, not written to JSON.
	Records []Record `json:"-"`
}

// Scenario is what the report says about a scenario besides its numbers.
type Scenario struct {
	Name        string
	Description string // one paragraph: workload and fleet
	Baseline    string // policy the % changes are against; "" means DefaultBaseline
	Target      string // optional: what the scenario is judged by, e.g. "P95 TTFT ≤ −97% vs round-robin"
	// Goals state Target's changes, when it has any, so that the report can say
	// whether each was met and whether the floor allows it at all.
	Goals []Goal
	// Floor, when known, is the TTFT no policy can beat on the scenario's trace.
	Floor *Floor
	// NoSharedPrefixes says that no two prompts of the trace share a prefix, so the
	// report says so instead of a prefix hit rate of 0%, which reads as a failure.
	NoSharedPrefixes bool
	// Servers, when set, adds a table of what each server and each kind of server
	// got under each policy, from the records' Endpoint.
	Servers []Server
}

// Goal is a target stated as a change of a TTFT percentile: Policy's at most
// Change percent from Against's (−97: at least 97% lower; +5: at most 5% higher).
type Goal struct {
	Percentile int     // 95 or 99 (50 also works)
	Change     float64 // in percent
	Policy     string  // the policy judged; "" means Subject
	Against    string  // "" means the scenario's baseline
}

// The policies a report's headline is about: Subject, kvgate's default, is
// measured against Reference, a policy that sees exact engine state (the best a
// router could do, not a competitor), and against HeadlineBaselines, what users
// run instead, in this order.
const (
	Subject   = "kvgate"
	Reference = "oracle"
)

// HeadlineBaselines are the policies the headline compares Subject with:
// what users run instead, then the defaults of the field's leading routers
// (llm-d's and Dynamo's, as kvgate's profiles reproduce them).
var HeadlineBaselines = []string{"kube-proxy", "round-robin", "least-request", "weighted-round-robin", "gie-default", "llm-d-sticky", "dynamo-kv"}

// Server is one endpoint of a scenario's fleet.
type Server struct {
	Endpoint string // as Record.Endpoint holds it
	Name     string // e.g. "h100-0"
	GPU      string // its GPU type, e.g. "h100"; the table also adds up each type
}

func (s Scenario) baseline() string {
	if s.Baseline == "" {
		return DefaultBaseline
	}
	return s.Baseline
}

// PercentileDefinition says, for reports, how every percentile here is taken.
const PercentileDefinition = "Percentiles are nearest-rank over successful requests: the p-th percentile of n " +
	"values is the ⌈p·n/100⌉-th smallest, with no interpolation. The terminal summary, the tables and the plots " +
	"all use this one definition."

// Summarize reduces one scenario × policy's records to a Result that keeps them.
// Latency percentiles are by nearest rank over successful requests only: a failed
// request has no first token, and its time to failure says nothing about routing.
// Errors are counted instead. The run's span covers every request, failed or not,
// since the run lasted that long either way; only delivered tokens count as
// throughput. Empty input gives zeros, never NaN, which JSON cannot hold.
func Summarize(scenario, policy, mode string, recs []Record) Result {
	r := Result{Scenario: scenario, Policy: policy, Mode: mode, Requests: len(recs), Records: recs}
	if len(recs) == 0 {
		return r
	}
	var ttft, itl, e2e []float64
	var out, prompt, cached int
	first, last := recs[0].Arrival, recs[0].Arrival
	for _, rec := range recs {
		first = min(first, rec.Arrival)
		last = max(last, rec.Arrival+rec.E2E)
		if rec.Error {
			r.Errors++
			continue
		}
		ttft = append(ttft, ms(rec.TTFT))
		e2e = append(e2e, ms(rec.E2E))
		if rec.OutputTokens >= 2 {
			itl = append(itl, ms(rec.E2E-rec.TTFT)/float64(rec.OutputTokens-1))
		}
		out += rec.OutputTokens
		prompt += rec.PromptTokens
		cached += rec.CachedTokens
	}
	for _, xs := range [][]float64{ttft, itl, e2e} {
		slices.Sort(xs)
	}
	r.TTFTP50ms, r.TTFTP95ms, r.TTFTP99ms = percentile(ttft, 50), percentile(ttft, 95), percentile(ttft, 99)
	r.ITLP50ms, r.ITLP95ms = percentile(itl, 50), percentile(itl, 95)
	r.E2EP95ms = percentile(e2e, 95)
	r.DurationS = (last - first).Seconds()
	if r.DurationS > 0 {
		r.OutputTokensPerS = float64(out) / r.DurationS
	}
	if prompt > 0 {
		r.PrefixHitRate = float64(cached) / float64(prompt)
	}
	if d, ok := drain(recs); ok {
		r.Drain, r.Unstable = &d, d.Unstable()
	}
	return r
}

// percentile is the nearest-rank p-th percentile of sorted, 0 when it is empty.
// p is a whole percent so the rank is exact: 0.95×100 in floating point is not 95.
func percentile(sorted []float64, p int) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := max((p*n+99)/100, 1) // ⌈p·n/100⌉
	return sorted[min(rank, n)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Change returns the relative change of v against base in percent (e.g. −97.1),
// and false when base is 0, where no change is defined.
func Change(v, base float64) (float64, bool) {
	if base == 0 {
		return 0, false
	}
	return (v - base) / base * 100, true
}

// section is one scenario's results in the order given.
type section struct {
	Scenario
	results []Result
}

// sections groups results under the scenarios in order. A result whose scenario
// has no metadata still gets a section after the described ones, so that nothing
// measured goes unreported.
func sections(scenarios []Scenario, results []Result) []section {
	var out []section
	at := map[string]int{}
	for _, s := range scenarios {
		if _, dup := at[s.Name]; dup {
			continue
		}
		at[s.Name] = len(out)
		out = append(out, section{Scenario: s})
	}
	for _, r := range results {
		i, ok := at[r.Scenario]
		if !ok {
			i = len(out)
			at[r.Scenario] = i
			out = append(out, section{Scenario: Scenario{Name: r.Scenario}})
		}
		out[i].results = append(out[i].results, r)
	}
	return out
}

// Share is the part of one policy's run that one server, or every server of a
// GPU type, answered, summarized by Summarize like the whole run so that its
// numbers and percentiles mean the same.
type Share struct {
	GPU    string // the servers' GPU type; "" for requests no listed server answered (failed, most likely)
	Server string // the server's name; "" on a GPU type's total and on the unlisted share
	Total  bool   // the row that adds up every server of GPU
	Result
}

// Shares splits r's records by the server that answered them: for each GPU type,
// in the order servers first name it, one Share per server (even one that got
// nothing, which is part of the story) and then the type's total; last, when there
// are any, the requests answered by no listed server. A server listed twice counts
// once.
func Shares(servers []Server, r Result) []Share {
	var uniq []Server
	byEndpoint := map[string][]Record{}
	for _, s := range servers {
		if _, dup := byEndpoint[s.Endpoint]; !dup {
			byEndpoint[s.Endpoint] = nil
			uniq = append(uniq, s)
		}
	}
	var unlisted []Record
	for _, rec := range r.Records {
		if recs, ok := byEndpoint[rec.Endpoint]; ok {
			byEndpoint[rec.Endpoint] = append(recs, rec)
		} else {
			unlisted = append(unlisted, rec)
		}
	}
	var gpus []string
	for _, s := range uniq {
		if !slices.Contains(gpus, s.GPU) {
			gpus = append(gpus, s.GPU)
		}
	}
	var out []Share
	for _, gpu := range gpus {
		var all []Record
		for _, s := range uniq {
			if s.GPU != gpu {
				continue
			}
			recs := byEndpoint[s.Endpoint]
			all = append(all, recs...)
			out = append(out, Share{GPU: gpu, Server: s.Name, Result: Summarize(r.Scenario, r.Policy, r.Mode, recs)})
		}
		out = append(out, Share{GPU: gpu, Total: true, Result: Summarize(r.Scenario, r.Policy, r.Mode, all)})
	}
	if len(unlisted) > 0 {
		out = append(out, Share{Result: Summarize(r.Scenario, r.Policy, r.Mode, unlisted)})
	}
	return out
}

// base returns the section's baseline row, if it was run.
func (s section) base() (row, bool) { return s.row(s.baseline()) }

// plotted are the results the plots and the servers table draw, a row each,
// labelled as the tables label them: a drawn policy by its median draw.
func (s section) plotted() []Result {
	rows := s.rows()
	out := make([]Result, len(rows))
	for i, r := range rows {
		out[i] = r.plotted
		var notes []string
		if r.Policy == Reference {
			notes = append(notes, "reference")
		}
		if r.drawn() {
			notes = append(notes, "median draw")
		}
		if r.Unstable {
			notes = append(notes, "unstable")
		}
		if len(notes) > 0 {
			out[i].Policy += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return out
}
