package demo

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/workload"
)

func TestDemoReports(t *testing.T) {
	var out strings.Builder
	dir := t.TempDir()
	opts := Options{LoadDuration: time.Second, Rate: 4, Seed: 1, Out: dir, ProgressEvery: 200 * time.Millisecond}
	if err := Run(context.Background(), &out, opts); err != nil {
		t.Fatal(err)
	}
	term := out.String()
	raw, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(raw)
	spec := loadSpec(opts)
	trace, err := workload.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	sh := shapeOf(spec, trace)

	t.Run("terminal", func(t *testing.T) {
		for _, want := range []string{"h100-0", "h100-1", "a10g-0", "a10g-1", "cached tokens", "LoRA", "TTFT p95",
			"picker round-robin:", "picker kvgate:", "the same bursty chat trace twice:\n   4 requests over " + secs(sh.last)} {
			if !strings.Contains(term, want) {
				t.Errorf("terminal lacks %q:\n%s", want, term)
			}
		}
	})
	t.Run("prefix cache", func(t *testing.T) {
		m := regexp.MustCompile(`first: TTFT (\d+) ms, 0 cached tokens;  again: TTFT (\d+) ms, (\d+) cached tokens`).FindStringSubmatch(term)
		if m == nil {
			t.Fatalf("no prefix-cache line:\n%s", term)
		}
		cold, _ := strconv.Atoi(m[1])
		warm, _ := strconv.Atoi(m[2])
		cached, _ := strconv.Atoi(m[3])
		if warm >= cold || cached < 5000 {
			t.Errorf("prefix cache: cold %d ms, warm %d ms, %d cached", cold, warm, cached)
		}
	})
	t.Run("every request served", func(t *testing.T) {
		served := regexp.MustCompile(`(?m)^\s+all\s+(\d+)\s`).FindAllStringSubmatch(term, -1)
		if len(served) != 2 {
			t.Fatalf("want two load phases:\n%s", term)
		}
		for _, m := range served {
			if n, _ := strconv.Atoi(m[1]); n != len(trace) {
				t.Errorf("a load phase served %d of %d:\n%s", n, len(trace), term)
			}
		}
	})
	// The second phase sends texts of its own: replaying the first phase's would
	// hit the prefix caches the first one filled.
	t.Run("no prefix shared", func(t *testing.T) {
		if !strings.Contains(md, "no shared prefixes in this trace") {
			t.Errorf("report lacks the no-shared-prefixes note:\n%s", md)
		}
	})
	t.Run("report describes the workload that ran", func(t *testing.T) {
		for _, want := range []string{
			"# kvgate demo\n\nCommand: `kvgate demo --seed 1 --rate 4 --duration 1s`.",
			"Workload seed 2 (the demo's --seed 1, plus one)",
			"- 4 requests arriving over " + secs(sh.last),
			"- Prompts: " + sh.prompt.String() + " tokens in this trace, drawn lognormal(mean 1500, σ 0.5) in [500, 4000].",
			"- Outputs: " + sh.output.String() + " tokens in this trace, drawn lognormal(mean 200, σ 0.5) in [50, 400]",
			"Asked for 4 req/s over 1 s",
		} {
			if !strings.Contains(md, want) {
				t.Errorf("report lacks %q:\n%s", want, md)
			}
		}
		for _, stale := range []string{"seed 0", "mean 512", "mean 256"} {
			if strings.Contains(md, stale) {
				t.Errorf("report states the suite's default %q:\n%s", stale, md)
			}
		}
	})
	t.Run("per-server table", func(t *testing.T) {
		for _, want := range []string{"| GPU | server | round-robin: requests |", "| h100 | h100-0 |", "| **a10g** | **all a10g** |"} {
			if !strings.Contains(md, want) {
				t.Errorf("report lacks %q:\n%s", want, md)
			}
		}
	})
	t.Run("terminal and report agree on percentiles", func(t *testing.T) {
		all := regexp.MustCompile(`(?m)^\s+all\s+\d+\s+(\S+ m?s)\s+(\S+ m?s)`).FindAllStringSubmatch(term, -1)
		for i, picker := range []string{"round-robin", "kvgate"} {
			row := regexp.MustCompile(`(?m)^\| ` + picker + ` \| \d+ \| \d+ \| ([\d.]+) \| ([\d.]+) \|`).FindStringSubmatch(md)
			if row == nil || len(all) != 2 {
				t.Fatalf("no %s row in the report or the terminal:\n%s\n%s", picker, md, term)
			}
			for j, name := range []string{"p50", "p95"} {
				inReport, _ := strconv.ParseFloat(row[1+j], 64)
				inTerm := parseMS(t, all[i][1+j])
				// The terminal rounds to the millisecond, or to 0.1 s from 10 s on.
				if d := inTerm - inReport; d < -50 || d > 50 || inReport < 10_000 && (d < -0.5 || d > 0.5) {
					t.Errorf("%s TTFT %s: terminal %v ms, report %v ms", picker, name, inTerm, inReport)
				}
			}
		}
	})
	t.Run("progress", func(t *testing.T) {
		for _, picker := range []string{"round-robin", "kvgate"} {
			for _, re := range []string{
				`(?m)^   ` + picker + `: sending 4 requests over ~\d+ s, open loop`,
				`(?m)^   ` + picker + `: \d+(\.\d)? s in, \d/4 sent, \d answered, \d in flight$`,
				`(?m)^   ` + picker + `: done, 4 requests answered in \d+(\.\d)? s$`,
			} {
				if !regexp.MustCompile(re).MatchString(term) {
					t.Errorf("terminal lacks %s:\n%s", re, term)
				}
			}
		}
	})
}

// parseMS reads the terminal's "123 ms" or "12.3 s".
func parseMS(t *testing.T, s string) float64 {
	t.Helper()
	num, unit, _ := strings.Cut(s, " ")
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	if unit == "s" {
		v *= 1000
	}
	return v
}

func TestShapeOf(t *testing.T) {
	spec := workload.Spec{Kind: workload.Bursty, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second}
	at := func(ts ...float64) workload.Trace {
		var tr workload.Trace
		for _, t := range ts {
			tr = append(tr, workload.Request{At: t, Prompt: []workload.Segment{{Tokens: 100 * (1 + len(tr))}}, OutputTokens: 10})
		}
		return tr
	}
	for _, tc := range []struct {
		name     string
		trace    workload.Trace
		last     time.Duration
		inBursts int
		peak1s   int
		rate     float64
		bursts   string
	}{
		{"a burst, a quiet spell and part of the next burst", at(0.1, 0.2, 0.3, 1.5, 2.5, 4, 5.2, 6, 6.5, 10),
			10 * time.Second, 8, 3, 1, // the last opens the third burst
			"3 bursts brought 8 requests (80%) at 2.0 req/s, the quiet spells between them 2 at 0.3 req/s"},
		{"within the first burst", at(0.5, 0.6, 1.9), 1900 * time.Millisecond, 3, 2, 3 / 1.9,
			"1 burst brought 3 requests (100%) at 1.6 req/s, before any quiet spell"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := shapeOf(spec, tc.trace)
			if sh.requests != len(tc.trace) || sh.last != tc.last || sh.inBursts != tc.inBursts || sh.peak1s != tc.peak1s {
				t.Errorf("shape %+v; want %d requests, last %v, %d in bursts, peak %d/s", sh, len(tc.trace), tc.last, tc.inBursts, tc.peak1s)
			}
			if r := sh.meanRate(); r < tc.rate-1e-9 || r > tc.rate+1e-9 {
				t.Errorf("mean rate %v, want %v", r, tc.rate)
			}
			if got := sh.bursts(); got != tc.bursts {
				t.Errorf("bursts %q, want %q", got, tc.bursts)
			}
		})
	}
	t.Run("lengths", func(t *testing.T) {
		sh := shapeOf(spec, at(1, 2, 3, 4))
		if got, want := sh.prompt.String(), "mean 250, median 200, 100–400"; got != want {
			t.Errorf("prompts %q, want %q", got, want)
		}
	})
}

// TestDescription holds the report's workload paragraph to the trace the demo's
// defaults generate, not to the workload package's defaults or the nominal rate.
func TestDescription(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"defaults", Options{LoadDuration: 15 * time.Second, Rate: 6, Seed: 1}},
		{"another seed and rate", Options{LoadDuration: 10 * time.Second, Rate: 3, Seed: 41}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := loadSpec(tc.opts)
			trace, err := workload.Generate(spec)
			if err != nil {
				t.Fatal(err)
			}
			sh := shapeOf(spec, trace)
			d := description(tc.opts, spec, sh)
			last := secs(seconds(trace[len(trace)-1].At))
			for _, want := range []string{
				strconv.Itoa(len(trace)) + " requests arriving over " + last,
				strconv.FormatFloat(float64(len(trace))/seconds(trace[len(trace)-1].At).Seconds(), 'f', 1, 64) + " req/s on average",
				"Workload seed " + strconv.FormatUint(tc.opts.Seed+1, 10),
				"Bursts of 2 s at 5× the quiet rate every 5 s",
				"drawn lognormal(mean 1500, σ 0.5) in [500, 4000]",
				"drawn lognormal(mean 200, σ 0.5) in [50, 400]",
			} {
				if !strings.Contains(d, want) {
					t.Errorf("description lacks %q:\n%s", want, d)
				}
			}
		})
	}
}

func TestProgress(t *testing.T) {
	for _, tc := range []struct {
		name       string
		run        time.Duration
		every      time.Duration
		wantTicks  bool
		sent, done int64
	}{
		{"a long phase reports as it goes", 120 * time.Millisecond, 20 * time.Millisecond, true, 7, 3},
		{"a phase shorter than a tick only starts and ends", 0, time.Hour, false, 10, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			p := &progress{w: &b, label: "kvgate", total: 10, every: tc.every}
			p.begin(11 * time.Second)
			p.sent.Store(tc.sent)
			p.done.Store(tc.done)
			start, done := time.Now(), make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { p.report(start, done) })
			time.Sleep(tc.run)
			close(done)
			wg.Wait()
			p.end(2 * time.Second)
			lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
			if lines[0] != "   kvgate: sending 10 requests over ~11 s, open loop, then waiting for the last answers …" {
				t.Errorf("first line %q", lines[0])
			}
			if want := "   kvgate: done, " + strconv.FormatInt(tc.done, 10) + " requests answered in 2 s"; lines[len(lines)-1] != want {
				t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
			}
			ticks := lines[1 : len(lines)-1]
			if tc.wantTicks != (len(ticks) > 0) {
				t.Fatalf("progress lines %q, want some: %v", ticks, tc.wantTicks)
			}
			for _, l := range ticks {
				if !regexp.MustCompile(`^   kvgate: \d+ s in, 7/10 sent, 3 answered, 4 in flight$`).MatchString(l) {
					t.Errorf("progress line %q", l)
				}
			}
		})
	}
}

// TestPhasesShareNoPrefix: the servers keep prompts in their prefix caches, so a
// second phase replaying the first one's texts would hit what the first left
// (26.8% of kvgate's prompt tokens in a run that did). No two prompts of the load
// phases may start alike.
func TestPhasesShareNoPrefix(t *testing.T) {
	const requests = 500
	seen := map[string]string{}
	for _, tc := range []struct {
		name  string
		phase int
	}{{"round-robin", 0}, {"kvgate", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range requests {
				// A simulated block is 16 tokens; each word here is one.
				start := strings.Join(strings.Fields(longPrompt(promptSeed(tc.phase)+i, 64))[:16], " ")
				if other, dup := seen[start]; dup {
					t.Fatalf("request %d starts like %s's: %q", i, other, start)
				}
				seen[start] = tc.name + " request " + strconv.Itoa(i)
			}
		})
	}
}
