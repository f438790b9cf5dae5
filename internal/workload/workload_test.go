package workload

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func generate(t *testing.T, s Spec) Trace {
	t.Helper()
	tr, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func jsonl(t *testing.T, tr Trace) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, tr); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// near fails unless got is within tol of want.
func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s %.4g, want %.4g ± %.3g", what, got, want, tol)
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, kind := range Kinds() {
		t.Run(kind, func(t *testing.T) {
			s := Spec{Kind: kind, Seed: 7, Requests: 500}
			a := generate(t, s)
			if want := 500; len(a) != want {
				t.Errorf("%d requests, want %d", len(a), want)
			}
			if !bytes.Equal(jsonl(t, a), jsonl(t, generate(t, s))) {
				t.Error("the same seed gave different traces")
			}
			s.Seed = 8
			if bytes.Equal(jsonl(t, a), jsonl(t, generate(t, s))) {
				t.Error("another seed gave the same trace")
			}
			if !slices.IsSortedFunc(a, func(x, y Request) int { return cmp.Compare(x.At, y.At) }) {
				t.Error("not sorted by arrival")
			}
			for i, r := range a {
				if err := r.validate(); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
		})
	}
}

// rate is the trace's mean arrival rate.
func rate(tr Trace) float64 { return float64(len(tr)) / tr[len(tr)-1].At }

func TestPoisson(t *testing.T) {
	tr := generate(t, Spec{Seed: 1, Requests: 5000, Rate: 20})
	if len(tr) != 5000 {
		t.Fatalf("%d requests", len(tr))
	}
	near(t, "rate", rate(tr), 20, 2)
	sum, outs := 0.0, 0.0
	for _, r := range tr {
		if n := r.PromptTokens(); n < 16 || n > 8192 || len(r.Prompt) != 1 {
			t.Fatalf("prompt %v out of the default bounds", r.Prompt)
		}
		sum += float64(r.PromptTokens())
		outs += float64(r.OutputTokens)
	}
	near(t, "mean prompt tokens", sum/5000, 512, 51)
	near(t, "mean output tokens", outs/5000, 256, 26)
}

func TestBursty(t *testing.T) {
	for _, tc := range []struct {
		name    string
		factor  float64
		on, off time.Duration
	}{
		{"defaults", 0, 0, 0},
		{"short cycles", 4, time.Second, 3 * time.Second},
		{"factor 1 is poisson", 1, 2 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{Kind: Bursty, Seed: 3, Requests: 5000, BurstFactor: tc.factor, BurstOn: tc.on, BurstOff: tc.off}
			tr := generate(t, s)
			s = s.withDefaults()
			f, on, off := s.BurstFactor, s.BurstOn.Seconds(), s.BurstOff.Seconds()
			inOn := 0
			for _, r := range tr {
				if math.Mod(r.At, on+off) < on {
					inOn++
				}
			}
			near(t, "share in on windows", float64(inOn)/float64(len(tr)), f*on/(f*on+off), 0.05)
			near(t, "rate", rate(tr), 10, 1)
		})
	}
}

// A spike trace is bursts of BurstSize arrivals within BurstSpread of k ×
// BurstEvery (k ≥ 1), and between them a Poisson background at Rate less the
// bursts' rate.
func TestSpike(t *testing.T) {
	for _, tc := range []struct {
		name          string
		s             Spec
		size          int
		every, spread time.Duration
		background    float64 // requests/s
		// Without a background: the bursts the trace begins and the arrivals
		// of the last, which Requests cuts short.
		wantBursts, wantInLastBurst int
	}{
		{"defaults", Spec{Requests: 1000}, 60, 10 * time.Second, 10 * time.Millisecond, 4, 0, 0},
		{"no background", Spec{Requests: 300, Rate: 64.0 / 5, BurstSize: 64, BurstEvery: 5 * time.Second}, 64, 5 * time.Second, 10 * time.Millisecond, 0, 5, 44},
		{"wide spread", Spec{Requests: 500, Rate: 12, BurstSize: 20, BurstEvery: 2 * time.Second, BurstSpread: 500 * time.Millisecond},
			20, 2 * time.Second, 500 * time.Millisecond, 2, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			s.Kind, s.Seed = Spike, 9
			tr := generate(t, s)
			if len(tr) != s.Requests {
				t.Fatalf("%d requests, want %d", len(tr), s.Requests)
			}
			every, spread := tc.every.Seconds(), tc.spread.Seconds()
			// An arrival within a burst's window (to the microsecond the trace
			// keeps) counts as the burst's.
			per := map[int]int{}
			first, last := map[int]float64{}, map[int]float64{}
			background, bursts := 0, 0
			for _, r := range tr {
				k := int(math.Floor(r.At/every + 1e-9))
				if off := r.At - float64(k)*every; k >= 1 && off >= -1e-6 && off <= spread+1e-6 {
					if per[k] == 0 {
						first[k] = off
					}
					per[k]++
					last[k] = off
					bursts = max(bursts, k)
				} else {
					background++
				}
			}
			for k := 1; k <= bursts; k++ {
				// A background arrival may fall inside a window too.
				n := per[k]
				switch {
				case k < bursts && (n < tc.size || n > tc.size+3):
					t.Errorf("burst %d: %d arrivals within %v of %gs, want %d", k, n, tc.spread, float64(k)*every, tc.size)
				case k == bursts && (n < 1 || n > tc.size+3):
					t.Errorf("the last burst has %d arrivals, want 1 to %d", n, tc.size)
				case k < bursts && last[k]-first[k] < spread/2:
					t.Errorf("burst %d spans %gs, want most of %gs", k, last[k]-first[k], spread)
				}
			}
			if tc.background == 0 {
				if bursts != tc.wantBursts || per[bursts] != tc.wantInLastBurst {
					t.Errorf("%d bursts, the last of %d arrivals; want %d, the last of %d", bursts, per[bursts], tc.wantBursts, tc.wantInLastBurst)
				}
				if background != 0 {
					t.Errorf("%d arrivals outside the bursts, want none", background)
				}
				if tr[0].At < every {
					t.Errorf("first arrival at %gs, before the first burst at %gs", tr[0].At, every)
				}
				return
			}
			near(t, "background rate", float64(background)/tr[len(tr)-1].At, tc.background, 0.2*tc.background)
		})
	}
}

func TestSharedPrefix(t *testing.T) {
	tr := generate(t, Spec{Kind: SharedPrefix, Seed: 2, Requests: 4000, Groups: 4, Users: 5, SystemTokens: 300})
	groups := map[string]int{}
	users := map[string]bool{}
	unique := map[string]bool{}
	for _, r := range tr {
		if len(r.Prompt) != 2 {
			t.Fatalf("prompt %v, want system + user segment", r.Prompt)
		}
		sys, u := r.Prompt[0], r.Prompt[1]
		if !slices.Contains([]string{"g-0", "g-1", "g-2", "g-3"}, sys.ID) || sys.Tokens != 300 || r.Group != sys.ID {
			t.Fatalf("system segment %v in group %q", sys, r.Group)
		}
		if unique[u.ID] || !strings.HasPrefix(u.ID, "u-") {
			t.Fatalf("user segment %q repeated or misnamed", u.ID)
		}
		if !strings.HasPrefix(r.Session, r.Group+"/user-") {
			t.Fatalf("user %q outside group %q", r.Session, r.Group)
		}
		unique[u.ID] = true
		users[r.Session] = true
		groups[sys.ID]++
	}
	if len(users) != 4*5 {
		t.Errorf("%d distinct users, want 20", len(users))
	}
	for g, n := range groups {
		near(t, g+" share", float64(n)/4000, 0.25, 0.04)
	}
}

func TestMultiTurn(t *testing.T) {
	tr := generate(t, Spec{Kind: MultiTurn, Seed: 4, Sessions: 50, Turns: 6, ThinkTime: 2 * time.Second})
	if len(tr) != 300 {
		t.Fatalf("%d requests, want 50 × 6", len(tr))
	}
	last := map[string]Request{}
	turns := map[string]int{}
	for _, r := range tr {
		k := turns[r.Session]
		turns[r.Session]++
		if len(r.Prompt) != 2*k+1 {
			t.Fatalf("session %s turn %d has %d segments, want %d", r.Session, k, len(r.Prompt), 2*k+1)
		}
		if k > 0 {
			prev := last[r.Session]
			n := len(prev.Prompt)
			if !slices.Equal(r.Prompt[:n], prev.Prompt) {
				t.Fatalf("turn %d of %s does not start with turn %d's prompt", k, r.Session, k-1)
			}
			if want := (Segment{fmt.Sprintf("%s/a%d", r.Session, k-1), prev.OutputTokens}); r.Prompt[n] != want {
				t.Fatalf("answer segment %v, want %v", r.Prompt[n], want)
			}
			a, b := BlockIDs(nil, prev.Prompt, 16), BlockIDs(nil, r.Prompt, 16)
			if !slices.Equal(b[:len(a)], a) {
				t.Fatalf("turn %d's blocks do not extend turn %d's", k, k-1)
			}
			if r.At < prev.At {
				t.Fatalf("turn %d at %g before turn %d at %g", k, r.At, k-1, prev.At)
			}
		}
		last[r.Session] = r
	}
	if len(turns) != 50 {
		t.Errorf("%d sessions", len(turns))
	}
	// Requests sets the number of sessions when Sessions is not given.
	if n := len(generate(t, Spec{Kind: MultiTurn, Requests: 1001})); n != 1005 {
		t.Errorf("1001 requests of 5 turns gave %d, want 1005", n)
	}
}

// A code-gen session works in one repository: its first prompt starts with
// the repository's context, which every later turn carries on and every
// session of the repository shares; repositories are Zipf-popular; the turns
// quote each other's answers as multi-turn's do.
func TestCodeGen(t *testing.T) {
	tr := generate(t, Spec{Kind: CodeGen, Seed: 5, Sessions: 2000, Turns: 3, Groups: 10, ZipfS: 1.1, SystemTokens: 4096})
	if len(tr) != 6000 {
		t.Fatalf("%d requests, want 2000 × 3", len(tr))
	}
	repoOf := map[string]string{} // session → repository
	sessions := map[string]map[string]bool{}
	for _, r := range tr {
		repo := r.Prompt[0]
		if repo.ID != r.Group || !strings.HasPrefix(repo.ID, "repo-") || repo.Tokens != 4096 {
			t.Fatalf("request of session %s starts with %v, in group %q", r.Session, repo, r.Group)
		}
		if prev, ok := repoOf[r.Session]; ok && prev != repo.ID {
			t.Fatalf("session %s in %s and %s", r.Session, prev, repo.ID)
		}
		repoOf[r.Session] = repo.ID
		if sessions[repo.ID] == nil {
			sessions[repo.ID] = map[string]bool{}
		}
		sessions[repo.ID][r.Session] = true
	}
	// Zipf with s = 1.1 over 10: repo-0 gets 1/H of the sessions, repo-9
	// about a twelfth of that.
	h := 0.0
	for k := 1; k <= 10; k++ {
		h += math.Pow(float64(k), -1.1)
	}
	near(t, "repo-0's share", float64(len(sessions["repo-0"]))/2000, 1/h, 0.03)
	if a, b := len(sessions["repo-0"]), len(sessions["repo-9"]); b == 0 || a < 8*b {
		t.Errorf("repo-0 has %d sessions, repo-9 %d", a, b)
	}
	// Turns quote their answers, as multi-turn's do.
	answers := tr.Answers()
	quoted := 0
	for _, a := range answers {
		if a.Tokens > 0 {
			quoted++
		}
	}
	if quoted != 2000*2 {
		t.Errorf("%d answers quoted, want 2 a session", quoted)
	}
}

func TestLoRAMix(t *testing.T) {
	tr := generate(t, Spec{Kind: LoRAMix, Seed: 5, Requests: 5000, Adapters: 8})
	count := map[string]int{}
	for _, r := range tr {
		count[r.Adapter]++
	}
	near(t, "base share", float64(count[""])/5000, 0.2, 0.03)
	for a, n := range count {
		if a != "" && a != "adapter-0" && n >= count["adapter-0"] {
			t.Errorf("%s has %d requests, adapter-0 only %d", a, n, count["adapter-0"])
		}
	}
	if len(count) != 9 || count["adapter-7"] == 0 {
		t.Errorf("adapters used: %v", count)
	}
}

func TestLongContext(t *testing.T) {
	tr := generate(t, Spec{Kind: LongContext, Seed: 6, Requests: 5000, LongShare: 0.3, LongTokens: 20000})
	long := 0
	for _, r := range tr {
		if r.PromptTokens() == 20000 {
			long++
		}
	}
	near(t, "long share", float64(long)/5000, 0.3, 0.03)
}

func TestGenerateErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Spec
		want string
	}{
		{"unknown kind", Spec{Kind: "zipf"}, "unknown kind"},
		{"negative requests", Spec{Requests: -1}, "requests"},
		{"negative rate", Spec{Rate: -1}, "rate"},
		{"NaN rate", Spec{Rate: math.NaN()}, "rate"},
		{"prompt mean", Spec{PromptTokens: Dist{Mean: -5}}, "prompt tokens mean"},
		{"output bounds", Spec{OutputTokens: Dist{Mean: 5, Min: 10, Max: 5}}, "output tokens bounds"},
		{"sigma", Spec{OutputTokens: Dist{Mean: 5, Sigma: -1}}, "sigma"},
		{"burst factor", Spec{Kind: Bursty, BurstFactor: 0.5}, "burst factor"},
		{"burst window", Spec{Kind: Bursty, BurstOn: -time.Second}, "burst on"},
		{"base share", Spec{Kind: LoRAMix, BaseShare: 1.5}, "base share"},
		{"long share", Spec{Kind: LongContext, LongShare: -0.1}, "long share"},
		{"turns", Spec{Kind: MultiTurn, Turns: -1}, "turns"},
		{"burst size", Spec{Kind: Spike, BurstSize: -1}, "burst size"},
		{"burst every", Spec{Kind: Spike, BurstEvery: -time.Second}, "burst every"},
		{"burst spread", Spec{Kind: Spike, BurstSpread: -time.Millisecond}, "burst spread"},
		{"bursts overlap", Spec{Kind: Spike, BurstEvery: time.Second, BurstSpread: time.Second}, "want below burst every"},
		{"rate below the bursts'", Spec{Kind: Spike, Rate: 5, BurstSize: 60, BurstEvery: 10 * time.Second}, "below the bursts' own 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Generate(tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one about %q", err, tc.want)
			}
		})
	}
}

func TestDist(t *testing.T) {
	tr := generate(t, Spec{Requests: 200, PromptTokens: Dist{Mean: 100}, OutputTokens: Dist{Mean: 50, Sigma: 3, Min: 40, Max: 60}})
	for _, r := range tr {
		if r.PromptTokens() != 100 || r.OutputTokens < 40 || r.OutputTokens > 60 {
			t.Fatalf("prompt %d, output %d: want 100 and [40, 60]", r.PromptTokens(), r.OutputTokens)
		}
	}
}

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		s    Spec
		want string
	}{
		{Spec{}, "poisson: 1000 requests at 10/s, seed 0, model meta-llama/Llama-3.1-8B-Instruct, prompt lognormal(mean 512, σ 0.8) in [16, 8192]"},
		{Spec{Kind: Bursty}, "bursts of 10× for 5s every 30s"},
		{Spec{Kind: SharedPrefix, Seed: 3}, "8 groups × 16 users, system prompt 2048 tokens"},
		{Spec{Kind: MultiTurn, Requests: 1000}, "1000 requests at 10/s, seed 0, model meta-llama/Llama-3.1-8B-Instruct, 200 sessions × 5 turns, think time 10s"},
		{Spec{Kind: LoRAMix}, "16 adapters, Zipf s 1.1, base share 0.2"},
		{Spec{Kind: LongContext}, "10% at 32768 tokens"},
		{Spec{Kind: CodeGen, Requests: 1000}, "200 sessions × 5 turns, think time 10s, in 8 repositories of Zipf s 1.1 with 2048-token contexts"},
		{Spec{Kind: Spike}, "bursts of 60 requests within 10ms every 10s, background 4/s"},
		{Spec{Kind: Spike, Rate: 6}, "background 0/s"},
	} {
		t.Run(tc.s.Kind, func(t *testing.T) {
			if got := Describe(tc.s); !strings.Contains(got, tc.want) {
				t.Fatalf("%q does not contain %q", got, tc.want)
			}
		})
	}
}
