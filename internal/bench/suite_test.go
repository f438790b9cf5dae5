package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// The suite keeps its scenarios, adds a version of mixed-gpu and bursty at
// which every baseline drains, and states every target it can as goals.
func TestSuite(t *testing.T) {
	for _, quick := range []bool{false, true} {
		sc, err := Suite("aws", quick)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range sc {
			names = append(names, s.Name)
			checkGoals(t, s)
		}
		want := "mixed-gpu,mixed-gpu-stable,bursty,bursty-ttft,shared-prefix,uniform-steady,lora-heavy,long-context,code-generation,kv-pressure"
		if strings.Join(names, ",") != want {
			t.Fatalf("quick %v: scenarios %v, want %s", quick, names, want)
		}
	}
	sc, _ := Suite("aws", false)
	byName := map[string]Scenario{}
	for _, s := range sc {
		byName[s.Name] = s
	}
	t.Run("mixed-gpu-stable: what round-robin sends an A10G is below what it sustains", func(t *testing.T) {
		s := byName["mixed-gpu-stable"]
		if perServer := s.Workload.Rate / 8; perServer >= a10gRate || s.Workload.Rate > 13 {
			t.Fatalf("%g requests/s, %g an A10G", s.Workload.Rate, perServer)
		}
		if !strings.Contains(byName["mixed-gpu"].Description, "overloads round-robin") {
			t.Fatalf("mixed-gpu's description does not say it overloads round-robin: %s", byName["mixed-gpu"].Description)
		}
	})
	t.Run("bursty-ttft: 10 s bursts at 1.5× the fleet's capacity", func(t *testing.T) {
		w := byName["bursty-ttft"].Workload
		on, off := w.BurstOn.Seconds(), w.BurstOff.Seconds()
		burst := w.BurstFactor * w.Rate * (on + off) / (w.BurstFactor*on + off)
		if on != 10 || math.Abs(burst/(4*h100x4Rate70b)-1.5) > 1e-9 {
			t.Fatalf("bursts of %gs at %g requests/s", on, burst)
		}
		tr, err := workload.Generate(w)
		if err != nil {
			t.Fatal(err)
		}
		// Over the whole cycles of the trace (it starts with a burst).
		cycles := math.Floor(tr[len(tr)-1].At / (on + off))
		n := 0
		for _, q := range tr {
			if q.At < cycles*(on+off) && math.Mod(q.At, on+off) < on {
				n++
			}
		}
		if got := float64(n) / (cycles * on); math.Abs(got/burst-1) > 0.05 {
			t.Fatalf("the trace's bursts arrive at %.1f requests/s, want %.1f", got, burst)
		}
	})
}

func suite(t *testing.T, name string, quick bool) []Scenario {
	t.Helper()
	sc, err := Suite(name, quick)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// checkGoals fails unless s states its target as goals the report can judge:
// at P95 or P99, against a policy the bench runs.
func checkGoals(t *testing.T, s Scenario) {
	t.Helper()
	if s.Target != "" && len(s.Goals) == 0 {
		t.Errorf("%s: target %q without goals", s.Name, s.Target)
	}
	for _, g := range s.Goals {
		if g.Percentile != 95 && g.Percentile != 99 || g.Against != "" && !slices.Contains(Policies, g.Against) {
			t.Errorf("%s: goal %+v", s.Name, g)
		}
	}
}

// A scenario whose A10G round-robin overloads is flagged unstable under
// round-robin, not under kvgate, which sends the A10G what it can take; at a
// load round-robin sustains, nothing is flagged.
func TestUnstableFlagged(t *testing.T) {
	fleet := mixedFleet()
	for _, tc := range []struct {
		name     string
		rate     float64
		policy   string
		unstable bool
	}{
		{"overloaded A10Gs under round-robin", 92, "round-robin", true},
		{"the same traffic under kvgate", 92, "kvgate", false},
		{"a load round-robin sustains", 8, "round-robin", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := workload.Generate(workload.Spec{Kind: "poisson", Seed: 5, Requests: 1500, Rate: tc.rate})
			if err != nil {
				t.Fatal(err)
			}
			recs, _, err := RunSim(context.Background(), SimOptions{Fleet: fleet, Policy: tc.policy, Seed: 1}, tr)
			if err != nil {
				t.Fatal(err)
			}
			r := report.Summarize("s", tc.policy, "sim", recs)
			if r.Drain == nil || r.Unstable != tc.unstable {
				t.Fatalf("unstable %v (%+v, P95 %.0f ms), want %v", r.Unstable, r.Drain, r.TTFTP95ms, tc.unstable)
			}
		})
	}
}

// The mixed suite holds aws's mixed-gpu-stable as it is, two fleets of other
// generations and a burst inside one scrape interval; every scenario is valid,
// quick-sized with --quick, and has a goal against the oracle.
func TestMixedSuite(t *testing.T) {
	aws := suite(t, "aws", false)
	awsStable := aws[slices.IndexFunc(aws, func(s Scenario) bool { return s.Name == "mixed-gpu-stable" })]
	full, quick := suite(t, "mixed", false), suite(t, "mixed", true)
	var names []string
	for i, s := range quick {
		names = append(names, s.Name)
		t.Run(s.Name, func(t *testing.T) {
			if s.Name != full[i].Name {
				t.Fatalf("quick scenario %d is %s, full %s", i, s.Name, full[i].Name)
			}
			if s.Description == "" || s.Target == "" {
				t.Errorf("description %q, target %q", s.Description, s.Target)
			}
			if !slices.ContainsFunc(s.Goals, func(g report.Goal) bool { return g.Against == Oracle && g.Percentile == 95 }) {
				t.Errorf("no P95 goal against the oracle: %+v", s.Goals)
			}
			checkGoals(t, s)
			if !slices.Contains(Policies, s.Baseline) {
				t.Errorf("baseline %q", s.Baseline)
			}
			// Valid, and runnable by `kvgate sim`: one address a server.
			opts, addrs, err := s.Fleet.Options(slog.New(slog.DiscardHandler))
			if want := servedBy(s.Fleet); err != nil || len(opts) != want || want < 6 {
				t.Fatalf("fleet: %d servers of %d, %v", len(opts), want, err)
			}
			if slices.Sort(addrs); len(slices.Compact(addrs)) != len(opts) {
				t.Errorf("servers share addresses: %v", addrs)
			}
			if want := max(200, full[i].Workload.Requests/10); s.Workload.Requests != want || want > 1500 {
				t.Errorf("quick: %d requests, want %d (a tenth of %d), at most 1500", s.Workload.Requests, want, full[i].Workload.Requests)
			}
			tr, err := workload.Generate(s.Workload)
			if err != nil || len(tr) != s.Workload.Requests {
				t.Fatalf("trace of %d requests: %v", len(tr), err)
			}
		})
	}
	if want := "mixed-gpu-stable,mixed-a100-l40s,mixed-generations,burst-at-once,burst-three-speeds"; strings.Join(names, ",") != want {
		t.Fatalf("scenarios %v, want %s", names, want)
	}
	byName := map[string]Scenario{}
	for _, s := range full {
		byName[s.Name] = s
	}
	t.Run("mixed-gpu-stable is the aws suite's, with a goal against the oracle added", func(t *testing.T) {
		s := byName["mixed-gpu-stable"]
		if !reflect.DeepEqual(s.Fleet, awsStable.Fleet) || s.Workload != awsStable.Workload || s.Description != awsStable.Description ||
			!strings.HasPrefix(s.Target, awsStable.Target) || !slices.Equal(s.Goals[:len(awsStable.Goals)], awsStable.Goals) {
			t.Fatalf("mixed suite's %+v\naws suite's %+v", s, awsStable)
		}
	})
	t.Run("stable loads: mixed-a100-l40s at 60–70% spread by capacity, an eighth below an L40S", func(t *testing.T) {
		rate := byName["mixed-a100-l40s"].Workload.Rate
		if share := rate / (4 * (a100Rate + l40sRate)); share < 0.6 || share > 0.7 || rate/8 >= l40sRate {
			t.Fatalf("%g requests/s: %.0f%% of the fleet, %g a server", rate, 100*share, rate/8)
		}
	})
	t.Run("burst-at-once: bursts inside one scrape interval, an eighth below an A10G", func(t *testing.T) {
		w := byName["burst-at-once"].Workload
		if w.Kind != workload.Spike || w.BurstSpread <= 0 || w.BurstSpread >= 50*time.Millisecond || w.BurstSize != spikeSize || w.Rate/8 >= a10gRate {
			t.Fatalf("%+v", w)
		}
	})
	t.Run("burst-three-speeds: burst-at-once's bursts on two servers of each of three speeds", func(t *testing.T) {
		s, at := byName["burst-three-speeds"], byName["burst-at-once"].Workload
		w := s.Workload
		if w.Kind != at.Kind || w.Rate != at.Rate || w.BurstSize != at.BurstSize || w.BurstEvery != at.BurstEvery || w.BurstSpread != at.BurstSpread || w.Seed == at.Seed {
			t.Fatalf("%+v, burst-at-once's %+v", w, at)
		}
		var gpus []string
		for _, sv := range s.Fleet.Servers {
			if sv.Replicas != 2 {
				t.Errorf("%d servers of %s", sv.Replicas, sv.GPU)
			}
			gpus = append(gpus, sv.GPU)
		}
		if strings.Join(gpus, ",") != "h100,a100,a10g" {
			t.Fatalf("GPUs %v", gpus)
		}
	})
}

// servedBy is how many servers fleet runs.
func servedBy(fleet simserver.FleetSpec) int {
	n := 0
	for _, s := range fleet.Servers {
		n += s.Replicas
	}
	return n
}

// seenShare is the share of trace's prompt tokens in leading full blocks that
// an earlier request computed: what Floor's warm replay, whose cache never
// evicts, finds cached, without replaying (the replay runs each request to its
// first token only, so it caches prompts' blocks and no answer's). A request
// hits the full blocks of the longest token prefix it shares with an earlier
// prompt, found in a trie of the prompts' segments: two prompts share a
// segment's tokens up to the shorter of its two lengths (token i of a segment
// is the same wherever its segment is), and nothing past a segment they
// differ in.
func seenShare(trace workload.Trace) float64 {
	type node struct {
		next    map[workload.Segment]*node
		longest map[string]int // the most tokens of each segment id seen here
	}
	newNode := func() *node { return &node{next: map[workload.Segment]*node{}, longest: map[string]int{}} }
	root := newNode()
	var hit, total int
	for _, q := range trace {
		shared, n := 0, root
		for _, seg := range q.Prompt {
			if c, ok := n.next[seg]; ok {
				shared, n = shared+seg.Tokens, c
				continue
			}
			shared += min(seg.Tokens, n.longest[seg.ID])
			break
		}
		// vLLM computes at least a prompt's last token.
		hit += min(shared/blockTokens, (q.PromptTokens()-1)/blockTokens) * blockTokens
		total += q.PromptTokens()
		n = root
		for _, seg := range q.Prompt {
			n.longest[seg.ID] = max(n.longest[seg.ID], seg.Tokens)
			c, ok := n.next[seg]
			if !ok {
				c = newNode()
				n.next[seg] = c
			}
			n = c
		}
	}
	return float64(hit) / float64(total)
}

// fleetTimeLine is what describeLoad says of the share of the fleet's time
// that s's trace, generated from spec, takes, with the cached share the idle
// replay would find.
func fleetTimeLine(t *testing.T, fleet simserver.FleetSpec, spec workload.Spec) string {
	t.Helper()
	tr, err := workload.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	load, err := describeLoad(fleet, spec, tr, seenShare(tr))
	if err != nil {
		t.Fatal(err)
	}
	_, line, ok := strings.Cut(load, "together ")
	if !ok {
		t.Fatalf("no share of the fleet's time in %q", load)
	}
	return line
}

// seenShare is the cached share Floor's warm replay finds, on the quick
// traces of the scenarios whose load depends on it.
func TestSeenShareIsFloors(t *testing.T) {
	for _, name := range []string{"tenants", "aws"} {
		for _, s := range suite(t, name, true) {
			if s.Name != "many-tenants-70" && s.Name != "code-generation" {
				continue
			}
			t.Run(s.Name, func(t *testing.T) {
				tr, err := workload.Generate(s.Workload)
				if err != nil {
					t.Fatal(err)
				}
				f, err := Floor(context.Background(), s.Fleet, tr)
				if err != nil {
					t.Fatal(err)
				}
				if got := seenShare(tr); math.Abs(got-f.CachedShare) > 1e-9 || got < 0.5 {
					t.Fatalf("seenShare %.6f, the floor's replay %.6f", got, f.CachedShare)
				}
			})
		}
	}
}

// The tenants suite sweeps one trace, on one fleet, over the loads its
// names say: the report's load line of each full trace gives that share of
// the fleet's time. The tenants' system prompts are more than one server's
// KV cache holds and less than the fleet's.
func TestTenantsSuite(t *testing.T) {
	full, quick := suite(t, "tenants", false), suite(t, "tenants", true)
	var names []string
	for i, s := range full {
		names = append(names, s.Name)
		checkGoals(t, s)
		first := full[0]
		if !reflect.DeepEqual(s.Fleet, first.Fleet) || s.Workload.Seed != first.Workload.Seed || s.Workload.Requests != first.Workload.Requests {
			t.Errorf("%s: fleet or trace differ from %s's", s.Name, first.Name)
		}
		if q := quick[i]; q.Name != s.Name || q.Workload.Requests != s.Workload.Requests/10 || q.Workload.Requests > 1500 {
			t.Errorf("quick %s: %d requests, full %d", q.Name, q.Workload.Requests, s.Workload.Requests)
		}
		if !strings.Contains(s.Description, fmt.Sprintf("%g requests/s, %d%% of the fleet's time", s.Workload.Rate, tenantLoads[i])) {
			t.Errorf("%s: description %q", s.Name, s.Description)
		}
	}
	if want := "many-tenants-70,many-tenants-90,many-tenants-100,many-tenants-110,many-tenants-120"; strings.Join(names, ",") != want {
		t.Fatalf("scenarios %v, want %s", names, want)
	}
	for i, s := range full {
		t.Run(s.Name, func(t *testing.T) {
			want := fmt.Sprintf("~%d%% of the fleet's time", tenantLoads[i])
			if got := fleetTimeLine(t, s.Fleet, s.Workload); !strings.HasPrefix(got, want) {
				t.Fatalf("load %q, want %q", got, want)
			}
		})
	}
	t.Run("the system prompts fill more than a server's KV cache, less than the fleet's", func(t *testing.T) {
		opts, _, err := full[0].Fleet.Options(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		e, err := sim.New(opts[0].Engine)
		if err != nil {
			t.Fatal(err)
		}
		w := full[0].Workload
		prompts, server := w.Groups*w.SystemTokens, e.NumBlocks()*blockTokens
		if prompts <= server || prompts >= len(opts)*server {
			t.Fatalf("%d tokens of system prompts, %d a server's KV cache, %d servers", prompts, server, len(opts))
		}
	})
}

// code-generation and kv-pressure run at 70% of the fleet's time, as the
// report counts it on their full traces; kv-pressure's answers fill a
// server's cache, and a quick run of it preempts, which its result reports.
func TestCodeGenAndKVPressure(t *testing.T) {
	byName := map[string]Scenario{}
	for _, s := range suite(t, "aws", false) {
		byName[s.Name] = s
	}
	for _, name := range []string{"code-generation", "kv-pressure"} {
		t.Run(name, func(t *testing.T) {
			s := byName[name]
			if got := fleetTimeLine(t, s.Fleet, s.Workload); !strings.HasPrefix(got, "~70% of the fleet's time") {
				t.Fatalf("load %q", got)
			}
		})
	}
	t.Run("kv-pressure preempts, and its result says how often", func(t *testing.T) {
		s, tr := quickScenario(t, "kv-pressure")
		recs, stats, err := RunSim(context.Background(), SimOptions{Fleet: s.Fleet, Policy: "round-robin"}, tr)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Preemptions == 0 || len(recs) != len(tr) {
			t.Fatalf("%d preemptions over %d requests", stats.Preemptions, len(recs))
		}
		res, err := RunSimJobs(context.Background(), []Job{{Scenario: s, Trace: tr, Policy: "round-robin"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Preemptions != int(stats.Preemptions) {
			t.Fatalf("result says %d preemptions, the engines %d", res[0].Preemptions, stats.Preemptions)
		}
	})
}

// The suites' names are what Suite knows, and an unknown one's error lists
// them.
func TestSuiteNames(t *testing.T) {
	for _, name := range Suites {
		if _, err := Suite(name, true); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err := Suite("azure", false)
	if err == nil || !strings.Contains(err.Error(), "known: aws, mixed") {
		t.Fatalf("error %v", err)
	}
}

// The capacities the mixed suite quotes for the A100 and the L40S are what
// sustainableRate measures on the suite's chat traffic, to within 2%.
func TestMixedSuiteRates(t *testing.T) {
	_, tr := quickScenario(t, "mixed-gpu")
	sample := sampleRequests(simArrivals(tr), capacitySample)
	for _, tc := range []struct {
		gpu  string
		want float64
	}{{"a100", a100Rate}, {"l40s", l40sRate}} {
		t.Run(tc.gpu, func(t *testing.T) {
			got, err := sustainableRate(sim.Config{GPU: tc.gpu, ModelSize: "8b", TensorParallel: 1}, sample)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got/tc.want-1) > 0.02 {
				t.Fatalf("%.2f requests/s, the suite quotes %g", got, tc.want)
			}
		})
	}
}

// On the mixed suite's quick traces, least-request, chat and the oracle drain
// in every scenario, and round-robin where the descriptions say it does: all
// but mixed-generations, whose A10Gs it overloads.
func TestMixedSuiteDrains(t *testing.T) {
	for _, s := range suite(t, "mixed", true) {
		tr, err := workload.Generate(s.Workload)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"round-robin", "least-request", "chat", Oracle} {
			t.Run(s.Name+"/"+p, func(t *testing.T) {
				r := run(t, s, tr, p)
				if want := p == "round-robin" && s.Name == "mixed-generations"; r.Drain == nil || r.Unstable != want {
					t.Fatalf("unstable %v (%+v, P95 %.0f ms), want %v", r.Unstable, r.Drain, r.TTFTP95ms, want)
				}
			})
		}
	}
}
