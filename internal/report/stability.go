package report

import (
	"cmp"
	"slices"
	"time"
)

// A run is judged for stability only with at least minJudged successful
// requests: ten per tenth of its arrivals.
const minJudged = 100

// Drain is what the stability criterion reads of a run: the P95 TTFT of the
// last tenth of its arrivals (by count, successful requests only), that of the
// second tenth (the first is the warm-up), and the span of its arrivals.
type Drain struct {
	LastTenthP95ms   float64 `json:"last_tenth_ttft_p95_ms"`
	SecondTenthP95ms float64 `json:"second_tenth_ttft_p95_ms"`
	ArrivalSpanS     float64 `json:"arrival_span_s"`
}

// StabilityDefinition says, for reports, when a run is flagged as one whose
// queue never drained.
const StabilityDefinition = "A run is **unstable** (its queue grows without draining by the end of the trace) when the P95 TTFT " +
	"of the last tenth of its arrivals is at least a quarter of the trace's span of arrivals and at least twice the P95 TTFT " +
	"of the second tenth. A queue that grows makes a request wait in proportion to when it came, so the last arrivals wait " +
	"a fixed share of the whole trace however long it is, while a stable queue's wait does not grow with the trace, " +
	"and a burst that ends a trace adds a wait of its own length, not the trace's. An unstable run's latencies grow with " +
	"the trace's length: they are shown as lower bounds (≥), and a change against them is flagged. Runs of fewer than " +
	"100 successful requests are not judged."

// drain measures recs for the stability criterion; ok is false when there are
// too few successful requests to judge.
func drain(recs []Record) (d Drain, ok bool) {
	var okRecs []Record
	first, last := time.Duration(0), time.Duration(0)
	for i, rec := range recs {
		if i == 0 || rec.Arrival < first {
			first = rec.Arrival
		}
		last = max(last, rec.Arrival)
		if !rec.Error {
			okRecs = append(okRecs, rec)
		}
	}
	if len(okRecs) < minJudged {
		return Drain{}, false
	}
	slices.SortStableFunc(okRecs, func(a, b Record) int { return cmp.Compare(a.Arrival, b.Arrival) })
	tenth := func(k int) float64 { // the P95 TTFT of the k-th tenth, from 0
		part := okRecs[k*len(okRecs)/10 : (k+1)*len(okRecs)/10]
		ttft := make([]float64, len(part))
		for i, rec := range part {
			ttft[i] = ms(rec.TTFT)
		}
		slices.Sort(ttft)
		return percentile(ttft, 95)
	}
	return Drain{LastTenthP95ms: tenth(9), SecondTenthP95ms: tenth(1), ArrivalSpanS: (last - first).Seconds()}, true
}

// Unstable applies the criterion of StabilityDefinition.
func (d Drain) Unstable() bool {
	return d.LastTenthP95ms >= d.ArrivalSpanS*1000/4 && d.LastTenthP95ms >= 2*d.SecondTenthP95ms && d.LastTenthP95ms > 0
}
