package route

// Decision is a pick as a trace records it (Request.Trace).
type Decision struct {
	// Candidates counts the endpoints the picker weighed.
	Candidates int
	// Winner is the endpoint reserved for the request, Score its total.
	Winner string
	Score  float64
	// Scores renders every ranked candidate's scores, as x-kvgate-scores.
	Scores string
}

// Decision is the pick, when the request asked for it (Request.Trace); the
// zero Decision otherwise.
func (r *Route) Decision() Decision { return r.decision }

// traced renders d while its candidates are still in the decision's scratch.
func traced(d decided) Decision {
	t := Decision{Candidates: len(d.cands), Winner: d.first.addr, Scores: explain(d.decision)}
	for _, c := range d.decision.Ranked {
		if c.Address == d.first.addr {
			t.Score = c.Score
			break
		}
	}
	return t
}
