package route

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/schedule"
)

// This file keeps each scheduler's last few decisions, with every candidate's
// scores, for the fleet page (GET /debug/decisions). It is on every decision's
// path, so it keeps at most one decision per decisionEvery: a decision not
// kept costs an atomic load.

const (
	// decisionLogSize is how many decisions a scheduler keeps.
	decisionLogSize = 50
	// decisionEvery is the least time between two kept decisions: at low
	// rates every decision is kept, at high ones the log spans a few seconds.
	decisionEvery = 50 * time.Millisecond
	// decisionCandidates bounds the candidates kept of one decision: its
	// best ranked, which is what a pick turns on.
	decisionCandidates = 16
)

// DecisionsView is one scheduler's kept decisions in /debug/decisions.
type DecisionsView struct {
	Scheduler string `json:"scheduler"`
	Model     string `json:"model"`
	// EverySeconds is the least time between two kept decisions.
	EverySeconds float64        `json:"everySeconds"`
	Decisions    []DecisionView `json:"decisions"` // newest first
}

// DecisionView is one routing decision.
type DecisionView struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"requestId,omitempty"`
	Model     string    `json:"model"`
	// Winner is the endpoint the request was sent to: the best ranked one
	// that had a free slot.
	Winner string `json:"winner"`
	// Considered counts the endpoints the picker saw, Candidates the best
	// ranked of them (at most 16), best first.
	Considered int             `json:"considered"`
	Candidates []CandidateView `json:"candidates"`
}

// CandidateView is one ranked endpoint of a decision.
type CandidateView struct {
	Address string  `json:"address"`
	Score   float64 `json:"score"`
	// Scores are the per-scorer scores, 0..1, by scorer name.
	Scores map[string]float64 `json:"scores"`
	// PredictedTTFTSeconds is what predictedLatency expected here, when it ran.
	PredictedTTFTSeconds float64 `json:"predictedTtftSeconds,omitempty"`
}

// decisionLog is a scheduler's ring of kept decisions.
type decisionLog struct {
	last atomic.Int64 // unix nanoseconds of the last kept decision
	mu   sync.Mutex
	next int // the slot the next kept decision takes
	n    int // slots in use
	ring [decisionLogSize]keptDecision
}

// keptDecision is a decision as kept: its candidates are copied (into a slice
// the slot reuses), the strings shared.
type keptDecision struct {
	at                 time.Time
	rid, model, winner string
	considered         int
	ranked             []schedule.Candidate
}

// keep records a decision unless one was kept less than decisionEvery before
// now.
func (l *decisionLog) keep(now time.Time, rid, model, winner string, considered int, ranked []schedule.Candidate) {
	t := now.UnixNano()
	last := l.last.Load()
	if last != 0 && t-last < int64(decisionEvery) || !l.last.CompareAndSwap(last, t) {
		return
	}
	l.mu.Lock()
	k := &l.ring[l.next]
	k.at, k.rid, k.model, k.winner, k.considered = now, rid, model, winner, considered
	k.ranked = append(k.ranked[:0], ranked[:min(len(ranked), decisionCandidates)]...)
	l.next = (l.next + 1) % decisionLogSize
	l.n = min(l.n+1, decisionLogSize)
	l.mu.Unlock()
}

// views renders the kept decisions, newest first.
func (l *decisionLog) views() []DecisionView {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]DecisionView, 0, l.n)
	for i := 1; i <= l.n; i++ {
		k := &l.ring[(l.next-i+decisionLogSize)%decisionLogSize]
		v := DecisionView{Time: k.at.UTC(), RequestID: k.rid, Model: k.model, Winner: k.winner, Considered: k.considered,
			Candidates: make([]CandidateView, len(k.ranked))}
		for j, c := range k.ranked {
			cv := CandidateView{Address: c.Address, Score: round3(c.Score), Scores: map[string]float64{}, PredictedTTFTSeconds: round3(c.PredictedTTFT)}
			for name, s := range c.Scores.All() {
				cv.Scores[name] = round3(s)
			}
			v.Candidates[j] = cv
		}
		out = append(out, v)
	}
	return out
}

// keepDecision offers a decision to its scheduler's log.
func (g *Router) keepDecision(p *scheduler, rid, model string, d decided) {
	g.decisionLogOf(p.name).keep(g.now(), rid, model, d.first.addr, len(d.cands), d.decision.Ranked)
}

// decisionLogOf returns a scheduler's decision log; logs outlive reloads.
func (g *Router) decisionLogOf(sched string) *decisionLog {
	if l, ok := g.decisionLogs.Load(sched); ok {
		return l.(*decisionLog)
	}
	l, _ := g.decisionLogs.LoadOrStore(sched, &decisionLog{})
	return l.(*decisionLog)
}

// Decisions is every configured scheduler's kept decisions, newest first.
func (g *Router) Decisions() []DecisionsView {
	out := []DecisionsView{}
	if rt := g.routes.Load(); rt != nil {
		for _, p := range rt.schedulers {
			out = append(out, DecisionsView{Scheduler: p.name, Model: p.spec.ModelName, EverySeconds: decisionEvery.Seconds(),
				Decisions: g.decisionLogOf(p.name).views()})
		}
	}
	return out
}
