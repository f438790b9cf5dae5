// Package schedule picks the endpoint for a request. A picker is a function of the
// request's features and the candidates' snapshots: no I/O and no clock (but to
// time its plugins for a Timer, which decides nothing), so the gateway, the
// Envoy picker and the virtual-time benchmark run the same code.
package schedule

import (
	"fmt"
	"iter"
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// Request is what a picker knows of a request.
type Request struct {
	Model   string // the model asked for
	Adapter string // the LoRA adapter, "" for the base model
	// PromptTokens estimates the prompt's length, for the prefill work it
	// adds (predictedLatency); 0 when unknown.
	PromptTokens float64
}

// Endpoint is one candidate as the picker sees it.
type Endpoint struct {
	Address string
	// InFlight counts the requests this gateway has sent to the endpoint and not
	// yet seen finish.
	InFlight int
	Signals
}

// Candidate is an endpoint with its score; higher is better.
type Candidate struct {
	Address string
	Score   float64
	// Scores holds the per-scorer scores, for x-kvgate-explain.
	Scores Scores
	// PredictedTTFT is the time to first token the predictedLatency scorer
	// expects of the request here, in seconds, when it ran.
	PredictedTTFT float64
}

// ScoreInFlight names the score the least-request picker ranks by, which
// Scores holds after the scorers'.
const ScoreInFlight = "inFlight"

// inFlightScore is ScoreInFlight's index in Scores.
const inFlightScore = len(scorers)

// Scores are a candidate's per-scorer scores; a fixed array, not a map, because a
// decision fills one per candidate.
type Scores struct {
	v   [len(scorers) + 1]float64
	set uint16 // bit i: v[i] was computed
}

// Scores.set has a bit per score: this fails to compile when the scorers
// outgrow it.
var _ [16 - len(Scores{}.v)]struct{}

// scoreName is the name of the score at index i of Scores.
func scoreName(i int) string {
	if i == inFlightScore {
		return ScoreInFlight
	}
	return string(scorers[i].Name)
}

func scoreIndex(name string) int {
	if name == ScoreInFlight {
		return inFlightScore
	}
	return scorerIndex(v1alpha1.ScorerName(name))
}

func (s *Scores) put(i int, v float64) { s.v[i], s.set = v, s.set|1<<i }

// Get returns the named score and whether the picker computed it.
func (s Scores) Get(name string) (float64, bool) {
	i := scoreIndex(name)
	if i < 0 || s.set&(1<<i) == 0 {
		return 0, false
	}
	return s.v[i], true
}

// All yields the set scores: the scorers' in registry order, then inFlight.
func (s Scores) All() iter.Seq2[string, float64] {
	return func(yield func(string, float64) bool) {
		for i := range s.v {
			if s.set&(1<<i) != 0 && !yield(scoreName(i), s.v[i]) {
				return
			}
		}
	}
}

// Decision ranks the candidates, best first; the ones after the first are the
// fallbacks a retry uses. A picker may rank only its best few.
type Decision struct {
	Ranked []Candidate
}

// Picker ranks endpoints for a request. Pick may reorder endpoints but keeps its
// elements. Implementations must be safe for concurrent use.
type Picker interface {
	Pick(req Request, endpoints []Endpoint) Decision
}

// New returns the named baseline picker: least-request, round-robin, random or
// power-of-two.
// "kvgate" here also means least-request: the GPU-aware picker needs weights and
// is built with NewWeighted (the gateway does so for "kvgate").
func New(name string, seed uint64) (Picker, error) {
	switch name {
	case "", PickerKvgate, Baselines[0]:
		return &LeastRequest{rng: newLockedRand(seed)}, nil
	case Baselines[1]:
		return &RoundRobin{}, nil
	case Baselines[2]:
		return &Random{rng: newLockedRand(seed)}, nil
	case Baselines[3]:
		return &PowerOfTwo{rng: newLockedRand(seed)}, nil
	default:
		return nil, fmt.Errorf("unknown picker %q", name)
	}
}

// LeastRequest ranks endpoints by requests in flight through this gateway, fewest
// first, breaking ties at random.
type LeastRequest struct{ rng *lockedRand }

var _ Picker = (*LeastRequest)(nil)

// Pick implements Picker.
func (p *LeastRequest) Pick(_ Request, eps []Endpoint) Decision {
	out := make([]Candidate, len(eps))
	lo, hi := 0, 0
	for i, e := range eps {
		if i == 0 || e.InFlight < lo {
			lo = e.InFlight
		}
		hi = max(hi, e.InFlight)
	}
	for i, e := range eps {
		s := 1.0
		if hi > lo {
			s = float64(hi-e.InFlight) / float64(hi-lo)
		}
		out[i] = Candidate{Address: e.Address, Score: s}
		out[i].Scores.put(inFlightScore, s)
	}
	p.rng.shuffle(out)
	slices.SortStableFunc(out, byScore)
	return Decision{Ranked: out}
}

// RoundRobin takes endpoints in turn.
type RoundRobin struct{ next atomic.Uint64 }

var _ Picker = (*RoundRobin)(nil)

// Pick implements Picker.
func (p *RoundRobin) Pick(_ Request, eps []Endpoint) Decision {
	if len(eps) == 0 {
		return Decision{}
	}
	start := int((p.next.Add(1) - 1) % uint64(len(eps)))
	out := make([]Candidate, len(eps))
	for i := range eps {
		e := eps[(start+i)%len(eps)]
		out[i] = Candidate{Address: e.Address, Score: 1 - float64(i)/float64(len(eps))}
	}
	return Decision{Ranked: out}
}

// Random picks uniformly.
type Random struct{ rng *lockedRand }

var _ Picker = (*Random)(nil)

// Pick implements Picker.
func (p *Random) Pick(_ Request, eps []Endpoint) Decision {
	out := make([]Candidate, len(eps))
	for i, e := range eps {
		out[i] = Candidate{Address: e.Address}
	}
	p.rng.shuffle(out)
	for i := range out {
		out[i].Score = 1 - float64(i)/float64(len(out))
	}
	return Decision{Ranked: out}
}

// PowerOfTwo samples two endpoints at random and takes the one with fewer requests
// in flight (the other is the fallback): the classic load balancer that needs no
// global view.
type PowerOfTwo struct{ rng *lockedRand }

var _ Picker = (*PowerOfTwo)(nil)

// Pick implements Picker.
func (p *PowerOfTwo) Pick(_ Request, eps []Endpoint) Decision {
	switch len(eps) {
	case 0:
		return Decision{}
	case 1:
		return Decision{Ranked: []Candidate{{Address: eps[0].Address, Score: 1}}}
	}
	var k [2]uint64
	p.rng.fill(k[:])
	i := int(k[0] % uint64(len(eps)))
	j := int(k[1] % uint64(len(eps)-1))
	if j >= i {
		j++
	}
	if eps[j].InFlight < eps[i].InFlight {
		i, j = j, i
	}
	return Decision{Ranked: []Candidate{{Address: eps[i].Address, Score: 1}, {Address: eps[j].Address, Score: 0.5}}}
}

func byScore(a, b Candidate) int {
	switch {
	case a.Score > b.Score:
		return -1
	case a.Score < b.Score:
		return 1
	}
	return 0
}

// lockedRand is a seeded source safe for concurrent pickers.
type lockedRand struct {
	mu  chan struct{}
	rng *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{mu: make(chan struct{}, 1), rng: rand.New(rand.NewPCG(seed, seed^0xdeadbeef))}
}

func (r *lockedRand) shuffle(c []Candidate) {
	r.mu <- struct{}{}
	r.rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	<-r.mu
}

// fill sets every key to a random value.
func (r *lockedRand) fill(keys []uint64) {
	r.mu <- struct{}{}
	for i := range keys {
		keys[i] = r.rng.Uint64()
	}
	<-r.mu
}
