// Package workload generates, stores and renders the seeded request traces that
// `kvgate bench` replays. A prompt is described by its shape, a list of segments
// with identities, rather than by its text: two prompts that hold the same segment
// at the same position share those tokens, which is all a prefix cache (simulated
// or real) needs to know. BlockIDs turns a shape into KV-cache block identities for
// the simulator; Text turns it into prefix-sharing text for a real server.
package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Segment is a run of prompt tokens with an identity: two prompts that hold the
// same segment ID at the same position share those tokens (and so a prefix cache).
type Segment struct {
	ID     string `json:"id"`
	Tokens int    `json:"tokens"`
}

// Request is one line of a trace.
type Request struct {
	At           float64   `json:"t"`                 // arrival, seconds from the start
	Model        string    `json:"model"`             // base model name
	Adapter      string    `json:"adapter,omitempty"` // LoRA adapter, "" for the base model
	Prompt       []Segment `json:"prompt"`            // the prompt's shape, in order
	OutputTokens int       `json:"output_tokens"`
	Session      string    `json:"session,omitempty"` // multi-turn or code-gen session id; the user in shared-prefix
	Group        string    `json:"group,omitempty"`   // shared-prefix group id; code-gen repository
}

// PromptTokens is the prompt's length: the sum of its segments' tokens.
func (r Request) PromptTokens() int {
	n := 0
	for _, s := range r.Prompt {
		n += s.Tokens
	}
	return n
}

// Trace is a workload, sorted by arrival.
type Trace []Request

// Workload kinds.
const (
	Poisson      = "poisson"
	Bursty       = "bursty"
	SharedPrefix = "shared-prefix"
	MultiTurn    = "multi-turn"
	LoRAMix      = "lora-mix"
	LongContext  = "long-context"
	Spike        = "spike"
	CodeGen      = "code-gen"
)

// Kinds lists the workload kinds Generate knows, for flags and help text.
func Kinds() []string {
	return []string{Poisson, Bursty, SharedPrefix, MultiTurn, LoRAMix, LongContext, Spike, CodeGen}
}

// Dist is a length distribution: a lognormal of mean Mean > 0 and log-space
// standard deviation Sigma ≥ 0 (0: always Mean), rounded and clamped to [Min, Max].
// Min below 1 means 1 and Max 0 means no upper bound. Mean is the mean before
// clamping, so the clamped mean is a little off when the bounds bite.
type Dist struct {
	Mean     float64
	Sigma    float64
	Min, Max int
}

// noMax bounds an unclamped draw so that a huge Sigma cannot overflow int.
const noMax = 1 << 30

func (d Dist) draw(r *rand.Rand) int {
	x := d.Mean
	if d.Sigma > 0 {
		// The lognormal's mean is exp(mu + sigma²/2); solve for mu.
		x = math.Exp(math.Log(d.Mean) - d.Sigma*d.Sigma/2 + d.Sigma*r.NormFloat64())
	}
	lo, hi := max(d.Min, 1), d.Max
	if hi == 0 {
		hi = noMax
	}
	return int(math.Round(min(max(x, float64(lo)), float64(hi))))
}

func (d Dist) validate(name string) error {
	switch {
	case !(d.Mean > 0) || math.IsInf(d.Mean, 0):
		return fmt.Errorf("workload: %s mean %g, want a positive number", name, d.Mean)
	case !(d.Sigma >= 0) || math.IsInf(d.Sigma, 0):
		return fmt.Errorf("workload: %s sigma %g, want ≥ 0", name, d.Sigma)
	case d.Min < 0 || d.Max < 0 || d.Max > 0 && d.Max < d.Min:
		return fmt.Errorf("workload: %s bounds [%d, %d]", name, d.Min, d.Max)
	}
	return nil
}

func (d Dist) String() string {
	s := strconv.FormatFloat(d.Mean, 'g', -1, 64)
	if d.Sigma > 0 {
		s = fmt.Sprintf("lognormal(mean %s, σ %g)", s, d.Sigma)
	}
	hi := "∞"
	if d.Max > 0 {
		hi = strconv.Itoa(d.Max)
	}
	return fmt.Sprintf("%s in [%d, %s]", s, max(d.Min, 1), hi)
}

// Spec describes a workload to generate. A zero field takes the default noted
// beside it (so a share or a count cannot be set to exactly zero); a zero Dist
// takes its default as a whole, since Sigma 0 means something.
type Spec struct {
	Kind         string // one of Kinds(); "" is poisson
	Seed         uint64
	Requests     int     // how many requests (1000)
	Rate         float64 // mean arrivals per second over the whole run (10)
	Model        string  // meta-llama/Llama-3.1-8B-Instruct
	PromptTokens Dist    // per-request unique prompt length (lognormal mean 512, σ 0.8, in [16, 8192])
	OutputTokens Dist    // lognormal mean 256, σ 0.8, in [8, 2048]

	// bursty: on/off arrivals starting with an "on" window; during "on" the rate is
	// BurstFactor × the "off" rate, so that the mean is still Rate.
	BurstFactor       float64       // 10; at least 1
	BurstOn, BurstOff time.Duration // 5s, 25s

	// spike: bursts of BurstSize requests, each arriving uniformly at random
	// within BurstSpread of the burst's start, one every BurstEvery, the first
	// after one BurstEvery; between and under them, Poisson arrivals at what is
	// left of Rate once the bursts' own BurstSize/BurstEvery is taken (none
	// when Rate equals it). Rate stays the mean over the run, so it must be at
	// least the bursts' rate. The trace ends at Requests requests, which may cut
	// the last burst short.
	BurstSize   int           // 60
	BurstEvery  time.Duration // 10s
	BurstSpread time.Duration // 10ms; below BurstEvery, so that bursts do not overlap

	// shared-prefix: Groups groups of Users users; a request comes from a user drawn
	// uniformly (so groups are equally popular) and is the group's system segment of
	// SystemTokens tokens followed by a unique segment of PromptTokens.
	Groups, Users int // 8, 16
	SystemTokens  int // 2048

	// multi-turn: Sessions conversations of Turns turns. Turn k's prompt is turn
	// k-1's prompt, then a segment standing for turn k-1's answer, then a new user
	// segment. Sessions start as a Poisson process at Rate/Turns (so requests arrive
	// at Rate in steady state) and each turn follows the previous one's arrival after
	// an exponential think time of mean ThinkTime: arrivals depend only on the
	// trace, never on how fast a server answers. The trace has Sessions × Turns
	// requests; Sessions defaults to ceil(Requests/Turns) when Requests is set, else
	// 100.
	Sessions, Turns int           // 100, 5
	ThinkTime       time.Duration // 10s

	// code-gen: multi-turn sessions, each working in one of Groups
	// repositories drawn with Zipf popularity of exponent ZipfS (repo-0 the
	// most popular), whose first prompt starts with the repository's context
	// of SystemTokens tokens: every session of a repository shares it, and
	// each of its turns carries it on.

	// lora-mix: a share BaseShare of requests use the base model; the others one of
	// Adapters adapters "adapter-0".."adapter-<Adapters-1>" with Zipf popularity of
	// exponent ZipfS (adapter-0 the most popular).
	Adapters         int     // 16
	ZipfS, BaseShare float64 // 1.1, 0.2

	// long-context: a share LongShare of requests have a prompt of LongTokens
	// tokens, the others of PromptTokens.
	LongShare  float64 // 0.1
	LongTokens int     // 32768
}

// def sets *v to d if it is zero.
func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// withDefaults fills the zero fields of s.
func (s Spec) withDefaults() Spec {
	def(&s.Kind, Poisson)
	def(&s.Model, "meta-llama/Llama-3.1-8B-Instruct")
	def(&s.PromptTokens, Dist{Mean: 512, Sigma: 0.8, Min: 16, Max: 8192})
	def(&s.OutputTokens, Dist{Mean: 256, Sigma: 0.8, Min: 8, Max: 2048})
	def(&s.Rate, 10)
	def(&s.BurstFactor, 10)
	def(&s.BurstOn, 5*time.Second)
	def(&s.BurstOff, 25*time.Second)
	def(&s.BurstSize, 60)
	def(&s.BurstEvery, 10*time.Second)
	def(&s.BurstSpread, 10*time.Millisecond)
	def(&s.Groups, 8)
	def(&s.Users, 16)
	def(&s.SystemTokens, 2048)
	def(&s.Turns, 5)
	def(&s.ThinkTime, 10*time.Second)
	def(&s.Adapters, 16)
	def(&s.ZipfS, 1.1)
	def(&s.BaseShare, 0.2)
	def(&s.LongShare, 0.1)
	def(&s.LongTokens, 32768)
	if s.Kind == MultiTurn || s.Kind == CodeGen {
		if s.Sessions == 0 && s.Requests > 0 && s.Turns > 0 {
			s.Sessions = (s.Requests + s.Turns - 1) / s.Turns
		}
		def(&s.Sessions, 100)
		if s.Sessions > 0 && s.Turns > 0 && s.Requests >= 0 {
			s.Requests = s.Sessions * s.Turns
		}
	}
	def(&s.Requests, 1000)
	def(&s.Sessions, 100)
	return s
}

func (s Spec) validate() error {
	if !slices.Contains(Kinds(), s.Kind) {
		return fmt.Errorf("workload: unknown kind %q (want one of %s)", s.Kind, strings.Join(Kinds(), ", "))
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"requests", s.Requests}, {"groups", s.Groups}, {"users", s.Users},
		{"system tokens", s.SystemTokens}, {"sessions", s.Sessions}, {"turns", s.Turns},
		{"adapters", s.Adapters}, {"long tokens", s.LongTokens}, {"burst size", s.BurstSize},
	} {
		if f.v < 0 {
			return fmt.Errorf("workload: %s %d, want ≥ 0", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"burst on", s.BurstOn}, {"burst off", s.BurstOff}, {"think time", s.ThinkTime},
		{"burst every", s.BurstEvery}, {"burst spread", s.BurstSpread}} {
		if f.v < 0 {
			return fmt.Errorf("workload: %s %v, want > 0", f.name, f.v)
		}
	}
	switch {
	case !(s.Rate > 0) || math.IsInf(s.Rate, 0):
		return fmt.Errorf("workload: rate %g, want a positive number", s.Rate)
	case !(s.BurstFactor >= 1) || math.IsInf(s.BurstFactor, 0):
		return fmt.Errorf("workload: burst factor %g, want ≥ 1", s.BurstFactor)
	case !(s.ZipfS >= 0) || math.IsInf(s.ZipfS, 0):
		return fmt.Errorf("workload: zipf exponent %g, want ≥ 0", s.ZipfS)
	case !(s.BaseShare >= 0 && s.BaseShare <= 1):
		return fmt.Errorf("workload: base share %g, want within [0, 1]", s.BaseShare)
	case !(s.LongShare >= 0 && s.LongShare <= 1):
		return fmt.Errorf("workload: long share %g, want within [0, 1]", s.LongShare)
	case s.BurstSpread >= s.BurstEvery:
		return fmt.Errorf("workload: burst spread %v, want below burst every (%v)", s.BurstSpread, s.BurstEvery)
	case s.Kind == Spike && s.spikeBackground() < 0:
		return fmt.Errorf("workload: rate %g below the bursts' own %g (burst size %d every %v)",
			s.Rate, s.spikeRate(), s.BurstSize, s.BurstEvery)
	}
	if err := s.PromptTokens.validate("prompt tokens"); err != nil {
		return err
	}
	return s.OutputTokens.validate("output tokens")
}

// Describe is a one-line summary of s, with defaults filled in, for reports.
func Describe(s Spec) string {
	s = s.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d requests at %g/s, seed %d, model %s", s.Kind, s.Requests, s.Rate, s.Seed, s.Model)
	switch s.Kind {
	case Bursty:
		fmt.Fprintf(&b, ", bursts of %g× for %v every %v", s.BurstFactor, s.BurstOn, s.BurstOn+s.BurstOff)
	case SharedPrefix:
		fmt.Fprintf(&b, ", %d groups × %d users, system prompt %d tokens", s.Groups, s.Users, s.SystemTokens)
	case MultiTurn:
		fmt.Fprintf(&b, ", %d sessions × %d turns, think time %v", s.Sessions, s.Turns, s.ThinkTime)
	case CodeGen:
		fmt.Fprintf(&b, ", %d sessions × %d turns, think time %v, in %d repositories of Zipf s %g with %d-token contexts",
			s.Sessions, s.Turns, s.ThinkTime, s.Groups, s.ZipfS, s.SystemTokens)
	case LoRAMix:
		fmt.Fprintf(&b, ", %d adapters, Zipf s %g, base share %g", s.Adapters, s.ZipfS, s.BaseShare)
	case LongContext:
		fmt.Fprintf(&b, ", %g%% at %d tokens", 100*s.LongShare, s.LongTokens)
	case Spike:
		fmt.Fprintf(&b, ", bursts of %d requests within %v every %v, background %.3g/s", s.BurstSize, s.BurstSpread, s.BurstEvery, s.spikeBackground())
	}
	fmt.Fprintf(&b, ", prompt %v, output %v", s.PromptTokens, s.OutputTokens)
	return b.String()
}

// Generate builds the trace s describes. The same Spec always gives the same
// trace: every random draw comes from one PCG seeded from s.Seed, in a fixed order.
func Generate(s Spec) (Trace, error) {
	s = s.withDefaults()
	if err := s.validate(); err != nil {
		return nil, err
	}
	g := &gen{s: s, rng: rand.New(rand.NewPCG(s.Seed, 0x6b76676174652f77))} // "kvgate/w"
	var t Trace
	switch s.Kind {
	case MultiTurn, CodeGen:
		t = g.multiTurn()
	case Bursty:
		// The mean over a cycle, (F·r·on + r·off) / (on + off), must be Rate.
		on, off := s.BurstOn.Seconds(), s.BurstOff.Seconds()
		g.onRate = s.BurstFactor * s.Rate * (on + off) / (s.BurstFactor*on + off)
		g.phaseEnd = on
		t = g.each(g.burstArrival, g.unique)
	case Spike:
		g.background = s.spikeBackground()
		g.nextBackground = math.Inf(1)
		if g.background > 0 {
			g.nextBackground = g.rng.ExpFloat64() / g.background
		}
		t = g.each(g.spikeArrival, g.unique)
	default:
		t = g.each(g.poissonArrival, g.request)
	}
	// Arrivals are kept to the microsecond: shorter trace lines, and no finer than
	// any replay can honour. Rounding keeps the order, and the stable sort keeps a
	// session's turns in order even if two round to the same instant.
	for i := range t {
		t[i].At = math.Round(t[i].At*1e6) / 1e6
	}
	slices.SortStableFunc(t, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return t, nil
}

type gen struct {
	s    Spec
	rng  *rand.Rand
	next int       // number of the next unique segment
	now  float64   // last arrival
	zipf []float64 // lora-mix, code-gen: cumulative Zipf weights

	// bursty: the rate in an "on" window, whether now is in an "off" one, and when
	// the current window ends.
	onRate   float64
	off      bool
	phaseEnd float64

	// spike: the background's rate and next arrival, the bursts begun so far,
	// and the current burst's arrivals not yet taken, in order.
	background     float64
	nextBackground float64
	bursts         int
	burst          []float64
}

// each generates s.Requests requests, arrival first, then the rest of the request.
func (g *gen) each(arrival func() float64, request func(at float64) Request) Trace {
	t := make(Trace, g.s.Requests)
	for i := range t {
		t[i] = request(arrival())
	}
	return t
}

func (g *gen) poissonArrival() float64 {
	g.now += g.rng.ExpFloat64() / g.s.Rate
	return g.now
}

// burstArrival draws the next arrival of a Poisson process whose rate is onRate in
// the first BurstOn of every cycle and onRate/BurstFactor in the rest, by spending
// a unit exponential of "work" across the phases it spans.
func (g *gen) burstArrival() float64 {
	work := g.rng.ExpFloat64()
	for {
		rate := g.onRate
		if g.off {
			rate /= g.s.BurstFactor
		}
		if need := work / rate; g.now+need < g.phaseEnd {
			g.now += need
			return g.now
		}
		work -= (g.phaseEnd - g.now) * rate
		g.now = g.phaseEnd
		g.off = !g.off
		if g.off {
			g.phaseEnd += g.s.BurstOff.Seconds()
		} else {
			g.phaseEnd += g.s.BurstOn.Seconds()
		}
	}
}

// spikeRate is what a spike workload's bursts add to the mean rate.
func (s Spec) spikeRate() float64 { return float64(s.BurstSize) / s.BurstEvery.Seconds() }

// spikeBackground is the rate of a spike workload's Poisson background: Rate
// less the bursts' rate, 0 when they are equal to within rounding (a Rate
// computed as BurstSize/BurstEvery), negative when Rate is below it.
func (s Spec) spikeBackground() float64 {
	b := s.Rate - s.spikeRate()
	if math.Abs(b) <= 1e-9*s.Rate {
		return 0
	}
	return b
}

// spikeArrival is the next arrival of the bursts merged with the background:
// the earlier of the background's next arrival and the current burst's next
// one. A burst's arrivals are drawn all at once, when the one before it is
// used up, as BurstSize uniform offsets within BurstSpread of its start.
func (g *gen) spikeArrival() float64 {
	if len(g.burst) == 0 {
		g.bursts++
		start, spread := float64(g.bursts)*g.s.BurstEvery.Seconds(), g.s.BurstSpread.Seconds()
		g.burst = make([]float64, g.s.BurstSize)
		for i := range g.burst {
			g.burst[i] = start + g.rng.Float64()*spread
		}
		slices.Sort(g.burst)
	}
	if g.nextBackground < g.burst[0] {
		at := g.nextBackground
		g.nextBackground += g.rng.ExpFloat64() / g.background
		return at
	}
	at := g.burst[0]
	g.burst = g.burst[1:]
	return at
}

func (g *gen) segment(prefix string, tokens int) Segment {
	g.next++
	return Segment{ID: prefix + strconv.Itoa(g.next-1), Tokens: tokens}
}

// unique is a request whose prompt is one unique segment of PromptTokens.
func (g *gen) unique(at float64) Request {
	return Request{
		At:           at,
		Model:        g.s.Model,
		Prompt:       []Segment{g.segment("u-", g.s.PromptTokens.draw(g.rng))},
		OutputTokens: g.s.OutputTokens.draw(g.rng),
	}
}

// request is one request of the Poisson-arrival kinds.
func (g *gen) request(at float64) Request {
	s := g.s
	switch s.Kind {
	case SharedPrefix:
		user := g.rng.IntN(s.Groups * s.Users)
		group := "g-" + strconv.Itoa(user/s.Users)
		r := g.unique(at)
		r.Prompt = append([]Segment{{ID: group, Tokens: s.SystemTokens}}, r.Prompt...)
		r.Group = group
		r.Session = group + "/user-" + strconv.Itoa(user%s.Users)
		return r
	case LoRAMix:
		r := g.unique(at)
		if g.rng.Float64() >= s.BaseShare {
			r.Adapter = "adapter-" + strconv.Itoa(g.zipfIndex(s.Adapters))
		}
		return r
	case LongContext:
		r := g.unique(at)
		if g.rng.Float64() < s.LongShare {
			r.Prompt[0].Tokens = s.LongTokens
		}
		return r
	}
	return g.unique(at)
}

// zipfIndex draws an index below n with probability ∝ 1/(k+1)^ZipfS, n the
// same at every call of a trace. A table rather than rand.Zipf, which wants an
// exponent above 1.
func (g *gen) zipfIndex(n int) int {
	if g.zipf == nil {
		sum := 0.0
		for k := range n {
			sum += math.Pow(float64(k+1), -g.s.ZipfS)
			g.zipf = append(g.zipf, sum)
		}
	}
	return sort.SearchFloat64s(g.zipf, g.rng.Float64()*g.zipf[len(g.zipf)-1])
}

func (g *gen) multiTurn() Trace {
	s := g.s
	t := make(Trace, 0, s.Sessions*s.Turns)
	think := s.ThinkTime.Seconds()
	start := 0.0
	for n := range s.Sessions {
		start += g.rng.ExpFloat64() * float64(s.Turns) / s.Rate
		id := "s-" + strconv.Itoa(n)
		var repo Segment
		if s.Kind == CodeGen {
			repo = Segment{ID: "repo-" + strconv.Itoa(g.zipfIndex(s.Groups)), Tokens: s.SystemTokens}
		}
		var prev Request
		for k := range s.Turns {
			r := g.unique(start)
			r.Session, r.Group = id, repo.ID
			switch {
			case k == 0 && repo.ID != "":
				r.Prompt = append([]Segment{repo}, r.Prompt...)
			case k > 0:
				r.At = prev.At + g.rng.ExpFloat64()*think
				answer := Segment{ID: id + "/a" + strconv.Itoa(k-1), Tokens: prev.OutputTokens}
				// A fresh array: turn k must not write into turn k-1's prompt.
				r.Prompt = append(slices.Concat(prev.Prompt, []Segment{answer}), r.Prompt...)
			}
			t = append(t, r)
			prev = r
		}
	}
	return t
}
