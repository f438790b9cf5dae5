package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/schedule"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/simserver/simtest"
	"github.com/kvgate/kvgate/internal/workload"
)

func quickScenario(t *testing.T, name string) (Scenario, workload.Trace) {
	t.Helper()
	sc, err := Suite("aws", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sc {
		if s.Name == name {
			tr, err := workload.Generate(s.Workload)
			if err != nil {
				t.Fatal(err)
			}
			return s, tr
		}
	}
	t.Fatalf("no scenario %s", name)
	return Scenario{}, nil
}

func run(t *testing.T, s Scenario, tr workload.Trace, policy string) report.Result {
	t.Helper()
	recs, _, err := RunSim(context.Background(), SimOptions{Fleet: s.Fleet, Policy: policy, Seed: 1}, tr)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(tr) {
		t.Fatalf("%d records for %d requests", len(recs), len(tr))
	}
	return report.Summarize(s.Name, policy, "sim", recs)
}

// The virtual-time runs reproduce exactly: same trace, same seed, same records.
func TestSimDeterministic(t *testing.T) {
	s, tr := quickScenario(t, "mixed-gpu")
	a, _, err := RunSim(context.Background(), SimOptions{Fleet: s.Fleet, Policy: "kvgate", Seed: 3}, tr)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := RunSim(context.Background(), SimOptions{Fleet: s.Fleet, Policy: "kvgate", Seed: 3}, tr)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("record %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
}

// The directions the benchmark exists to show, on reduced workloads: GPU-aware
// routing rescues a mixed fleet that round-robin overloads, prefix affinity cuts
// TTFT on shared prompts, and a uniform fleet under steady load loses nothing.
func TestSimDirections(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		check    func(rr, kv report.Result) bool
		what     string
	}{
		{"mixed-gpu", func(rr, kv report.Result) bool { return kv.TTFTP95ms < rr.TTFTP95ms/10 }, "P95 TTFT a tenth of round-robin's or less"},
		{"shared-prefix", func(rr, kv report.Result) bool {
			return kv.TTFTP95ms < rr.TTFTP95ms/2 && kv.PrefixHitRate > rr.PrefixHitRate
		}, "P95 TTFT halved, more prefix hits"},
		{"uniform-steady", func(rr, kv report.Result) bool {
			return kv.TTFTP95ms < rr.TTFTP95ms*1.1 && kv.OutputTokensPerS > rr.OutputTokensPerS*0.97
		}, "no worse than round-robin"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			s, tr := quickScenario(t, tc.scenario)
			rr, kv := run(t, s, tr, "round-robin"), run(t, s, tr, "kvgate")
			if rr.Errors+kv.Errors > 0 || !tc.check(rr, kv) {
				t.Fatalf("want %s: round-robin p95 %.1f ms hits %.2f, kvgate p95 %.1f ms hits %.2f (errors %d/%d)",
					tc.what, rr.TTFTP95ms, rr.PrefixHitRate, kv.TTFTP95ms, kv.PrefixHitRate, rr.Errors, kv.Errors)
			}
		})
	}
}

// A burst arriving inside one scrape interval on an idle fleet spreads: only the
// gateway's own accounting can see it.
func TestSimBurstSpreads(t *testing.T) {
	fleet := simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{servers("h100", "h100", "8b", 1, 8, nil)}}
	var tr workload.Trace
	for i := range 64 {
		tr = append(tr, workload.Request{At: 1 + float64(i)*1e-4, Model: llama8b,
			Prompt: []workload.Segment{{ID: fmt.Sprint("u", i), Tokens: 500}}, OutputTokens: 50})
	}
	for _, p := range []string{"kvgate", "gie-default", "least-request"} {
		per := map[int]int{}
		for _, srv := range simProbe(t, SimOptions{Fleet: fleet, Policy: p, Seed: 1}, tr) {
			per[srv]++
		}
		// Counted dispatches even it out to the request; chance alone (ties broken
		// at random on equal scrapes) would not.
		for srv := range 8 {
			if per[srv] < 7 || per[srv] > 9 {
				t.Fatalf("%s: burst of 64 over 8 idle servers: %v", p, per)
			}
		}
	}
}

// simProbe returns the server each request was routed to.
func simProbe(t *testing.T, opts SimOptions, tr workload.Trace) []int {
	t.Helper()
	var out []int
	opts.probe = func(server []int) { out = append([]int(nil), server...) }
	if _, _, err := RunSim(context.Background(), opts, tr); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRunWritesReport(t *testing.T) {
	dir := t.TempDir()
	var out, progress bytes.Buffer
	err := Run(context.Background(), &out, Config{Suite: "aws", Quick: true, Scenarios: []string{"uniform-steady"},
		Policies: []string{"round-robin", "kvgate"}, Out: dir, SaveTraces: true, CommandLine: "kvgate bench --quick", Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	// Progress goes where it is told, a line per floor and per run, numbered;
	// the results' writer gets none of it.
	for _, want := range []string{"uniform-steady   idle-engine floor: TTFT p95", "[1/2]   uniform-steady", "[2/2]   uniform-steady"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("no %q in the progress:\n%s", want, progress.String())
		}
	}
	if strings.Contains(out.String(), "[1/2]") || strings.Contains(out.String(), "idle-engine floor: TTFT") {
		t.Errorf("progress on the results' writer:\n%s", out.String())
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Headline", "**Idle-engine floor**", "| idle-engine floor (reference) |", "- kvgate against round-robin (per request): P95 ",
		"- **round-robin**: per-request round-robin", "Load, from the trace and the engines' cost model: ", "- P95 ≤ +5% against round-robin: **met**"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("no %q in report.md:\n%s", want, md)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res []map[string]any
	if err := json.Unmarshal(raw, &res); err != nil || len(res) != 2 || res[1]["policy"] != "kvgate" || res[1]["requests"].(float64) != 2000 {
		t.Fatalf("results.json: %v %s", err, raw)
	}
	for _, f := range []string{"report.md", "plots/uniform-steady-ttft-cdf.svg", "traces/uniform-steady.jsonl"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(out.String(), "uniform-steady") {
		t.Errorf("no summary on stdout: %s", out.String())
	}
	// The saved trace replays on a fleet file to the same figures.
	fleetFile := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("servers:\n- {name: h, listen: '127.0.0.1:20000', replicas: 8, gpu: h100, model: m, modelSize: 8b}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Run(context.Background(), &out, Config{TraceFile: filepath.Join(dir, "traces/uniform-steady.jsonl"), FleetFile: fleetFile, Policies: []string{"kvgate"}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "replay") {
		t.Errorf("replay summary: %s", out.String())
	}
}

func TestRunRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown scenario", Config{Scenarios: []string{"nope"}}, `unknown scenario "nope"`},
		{"unknown policy", Config{Quick: true, Scenarios: []string{"bursty"}, Policies: []string{"best"}}, `unknown policy "best"`},
		{"unknown suite", Config{Suite: "gcp"}, `unknown suite`},
		{"trace without fleet", Config{TraceFile: "x.jsonl"}, "--trace and --fleet go together"},
		{"unknown mode", Config{Mode: "dream"}, "unknown mode"},
		{"live without target", Config{Mode: "live"}, "needs --target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), &bytes.Buffer{}, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// Live mode against a real simulated server over loopback: every request
// streams to completion and is timed.
func TestLive(t *testing.T) {
	s := simtest.Start(t, simserver.Options{Model: llama8b})
	var out bytes.Buffer
	dir := t.TempDir()
	err := Run(context.Background(), &out, Config{Mode: "live", Quick: true, Scenarios: []string{"shared-prefix"}, Out: dir,
		Live: LiveConfig{Targets: []string{"direct=http://" + s.Addr()}, Requests: 20, Rate: 10, MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	var res []report.Result
	if err := json.Unmarshal(raw, &res); err != nil || len(res) != 1 {
		t.Fatalf("results: %v %s", err, raw)
	}
	r := res[0]
	if r.Requests != 20 || r.Errors != 0 || r.TTFTP50ms <= 0 || r.OutputTokensPerS <= 0 || r.PrefixHitRate <= 0 || r.Mode != "live" {
		t.Fatalf("live result %+v\n%s", r, out.String())
	}
}

func TestTune(t *testing.T) {
	var out, progress bytes.Buffer
	// Tuned on one scenario, per scenario: the search as Tune runs it, then
	// the table of distances.
	bests, err := TunePerScenario(context.Background(), &out, TuneConfig{Suite: "aws", Quick: true, Scenarios: []string{"mixed-gpu"}, Profile: "gie-default", Seed: 1,
		Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "[eval 1, start] gie-default → ") || !strings.Contains(progress.String(), "[eval 2, pass 1, ") ||
		strings.Contains(out.String(), "[eval") {
		t.Fatalf("progress:\n%s\noutput:\n%s", progress.String(), out.String())
	}
	if !strings.Contains(out.String(), "weights: {queue:") || !strings.Contains(out.String(), "best:") {
		t.Fatalf("output:\n%s", out.String())
	}
	p := bests[0]
	if !strings.Contains(out.String(), "How far profile gie-default is from each scenario's best weights (p95-ttft)") ||
		!strings.Contains(strings.Join(strings.Fields(out.String()), " "), "% "+describe(p)) {
		t.Fatalf("per-scenario output, want mixed-gpu's row with %q:\n%s", describe(p), out.String())
	}
	// What it found beats where it started on the same trace: on a mixed fleet
	// GIE's weights leave KV usage, the signal that the small A10G caches fill
	// first, underweighted.
	s, tr := quickScenario(t, "mixed-gpu")
	start := run(t, s, tr, "gie-default")
	recs, _, err := RunSim(context.Background(), SimOptions{Fleet: s.Fleet, Profile: &p, Seed: 1}, tr)
	if err != nil {
		t.Fatal(err)
	}
	if got := report.Summarize("", "", "", recs); got.TTFTP95ms > 0.95*start.TTFTP95ms {
		t.Fatalf("tuned p95 %.1f ms, not clearly better than the start's %.1f ms", got.TTFTP95ms, start.TTFTP95ms)
	}
	if _, err := Tune(context.Background(), &out, TuneConfig{Objective: "fastest"}); err == nil {
		t.Error("unknown objective accepted")
	}
	if _, err := TunePerScenario(context.Background(), &out, TuneConfig{Suite: "aws", Scenarios: []string{"nowhere"}}); err == nil {
		t.Error("an unknown scenario accepted")
	}
}

// Targets of one live run share no prompt text, so that none warms another's
// prefix cache; within a target the trace's own sharing stays.
func TestRelabel(t *testing.T) {
	tr := workload.Trace{
		{Prompt: []workload.Segment{{ID: "g-1", Tokens: 100}, {ID: "u-1", Tokens: 10}}},
		{Prompt: []workload.Segment{{ID: "g-1", Tokens: 100}, {ID: "u-2", Tokens: 10}}},
	}
	a, b := relabel(tr, "x/0/1"), relabel(tr, "x/1/1")
	ta, tb := workload.Text(a[0].Prompt), workload.Text(b[0].Prompt)
	if ta[:40] == tb[:40] || len(ta) < 300 {
		t.Fatalf("targets share text: %.40q / %.40q", ta, tb)
	}
	if tb2 := workload.Text(b[1].Prompt); tb2[:300] != tb[:300] {
		t.Fatal("the trace's own shared prefix was lost")
	}
	if tr[0].Prompt[0].ID != "g-1" {
		t.Fatal("relabel changed its input")
	}
}

// The live client reads the stream as servers write it, and a stream that ends
// badly is an error, not a fast success.
func TestLiveStreamParsing(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		err        bool
		tokens     int
	}{
		{"standard", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n", false, 2},
		{"no space after data:", "data:{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata:[DONE]\n\n", false, 1},
		{"reasoning tokens count", "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"r\"}}]}\n\ndata: [DONE]\n\n", false, 1},
		{"no [DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", true, 0},
		{"error event", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n", true, 0},
		{"aborted", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			rec := send(context.Background(), srv.Client(), srv.URL, workload.Request{Model: "m", Prompt: []workload.Segment{{ID: "a", Tokens: 5}}, OutputTokens: 2},
				time.Now(), LiveConfig{Timeout: 5 * time.Second})
			if rec.Error != tc.err || (!tc.err && rec.OutputTokens != tc.tokens) {
				t.Fatalf("error %v tokens %d, want error %v tokens %d", rec.Error, rec.OutputTokens, tc.err, tc.tokens)
			}
		})
	}
}

func TestSimCancelled(t *testing.T) {
	s, tr := quickScenario(t, "uniform-steady")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := RunSim(ctx, SimOptions{Fleet: s.Fleet, Policy: "kvgate"}, tr); err == nil {
		t.Fatal("a cancelled run reported success")
	}
}

// TestPoliciesRegistered: every policy the bench compares is a picker or a
// profile that schedule registers, or weights a user can set, so a bench
// result names something a user can configure.
func TestPoliciesRegistered(t *testing.T) {
	known := schedule.PickerNames()
	for _, n := range schedule.ProfileNames() {
		known = append(known, string(n))
	}
	for _, p := range Policies {
		if benchPolicy(p) { // kube-proxy, weighted-round-robin, oracle: what a fleet gets without kvgate
			continue
		}
		if pr, ok := benchProfile(p); ok {
			for w := range pr.Weights {
				if !slices.Contains(schedule.WeightNames(), w) {
					t.Errorf("bench policy %q weighs %q, which no scheduler can set", p, w)
				}
			}
			if _, described := PolicyDescriptions[p]; !described {
				t.Errorf("bench policy %q has no description", p)
			}
			continue
		}
		if !slices.Contains(known, p) {
			t.Errorf("bench policy %q is neither a picker nor a profile (%v)", p, known)
		}
	}
}
