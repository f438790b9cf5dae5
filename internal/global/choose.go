package global

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Candidate is one member as the chooser sees it for one request's model.
type Candidate struct {
	Name   string
	Region string
	// Price is what a million tokens cost on this member.
	Price float64
	// Weight is the member's capacity weight: members of one price tier share
	// traffic in its proportion.
	Weight float64
	// Ramp is 1, or less while a returning member ramps up: it takes at most
	// that share of what it would otherwise take.
	Ramp float64
	// TTFTP50 and TTFTP95 are the member's recent median and 95th-percentile
	// time to first token for the model (0: no recent samples); Samples how
	// many they rest on.
	TTFTP50, TTFTP95 time.Duration
	Samples          int
	// WaitingPerEndpoint is the member's queue for the model over its ready
	// endpoints: the load signal that moves before the TTFT window does.
	WaitingPerEndpoint float64
	// SentPerEndpoint is what this router sent the member since its last
	// summary, over its ready endpoints: load the summary does not show yet.
	SentPerEndpoint float64
	// RunningPerEndpoint and MeanDuration say how fast a queue drains: a slot
	// frees every MeanDuration / RunningPerEndpoint.
	RunningPerEndpoint float64
	MeanDuration       time.Duration
	// Full says the member runs as many requests per endpoint as it has ever
	// been seen to: the next one will likely queue even with no queue yet.
	Full         bool
	KVCacheUsage float64
	ErrorRate    float64
	Requests     int // in the member's window, for ErrorRate's weight
}

// Policy is what one request asks of the choice.
type Policy struct {
	// SLO is the time to first token the request should get.
	SLO time.Duration
	// ClientRegion, when set, is where the client is; a member elsewhere is
	// predicted CrossRegion slower.
	ClientRegion string
	CrossRegion  time.Duration
	// MaxErrorRate sends members failing more than this share of their recent
	// requests to the back (when they have enough requests to tell).
	MaxErrorRate float64
	// PriceBlind turns the cost shaping off: members are taken by predicted TTFT
	// and weight alone (the baseline the cost saving is measured against).
	PriceBlind bool
}

// minErrorSamples is how many recent requests an error rate needs before it
// counts.
const minErrorSamples = 20

// Predicted is a member's expected time to first token for the next request:
// its recent median — what a request costs when it does not queue — plus the
// wait for a slot: each request queued ahead (per endpoint) waits for one slot
// to free, and a slot frees every MeanDuration / RunningPerEndpoint. Requests
// this router sent since the member's last summary count half, as some of them
// will have found a free slot; a member running at the most it was ever seen to
// run counts one more. Plus the distance to the client.
//
// The window's p95 is not the base: it holds the queueing of the last seconds,
// so a member that had been overloaded would stay shunned after its queue
// emptied. Without recent samples the base is a quarter of the SLO: an idle
// member is worth trying.
func (c Candidate) Predicted(p Policy) time.Duration {
	base := c.TTFTP50
	if c.Samples < 5 || base <= 0 {
		base = p.SLO / 4
	}
	ahead := c.WaitingPerEndpoint + 0.5*c.SentPerEndpoint
	if c.Full {
		ahead++
	}
	slot := base // without a duration yet, a queued request is assumed to cost a TTFT
	if c.MeanDuration > 0 {
		slot = time.Duration(float64(c.MeanDuration) / math.Max(1, c.RunningPerEndpoint))
	}
	d := base + time.Duration(ahead*float64(slot))
	if p.ClientRegion != "" && c.Region != "" && c.Region != p.ClientRegion {
		d += p.CrossRegion
	}
	return d
}

// spill is the probability of passing a member over for a dearer one: 0 while
// its predicted TTFT is under 80% of the SLO, rising to 1 at 120%. The ramp
// keeps the split smooth where a hard threshold would send all the traffic one
// way, then all of it back once the cheap member recovered.
func spill(predicted, slo time.Duration) float64 {
	if slo <= 0 {
		return 0
	}
	x := (float64(predicted) - 0.8*float64(slo)) / (0.4 * float64(slo))
	return math.Min(1, math.Max(0, x))
}

// Rank orders the candidates for one request: the member to try first, then
// the ones to fail over to. rnd draws uniform numbers in [0, 1).
//
// Cost-aware shaping: members are walked from the cheapest (same region first
// among equal prices; within a tier in a weighted random order); each takes the
// request with probability (1 − spill) × ramp, so cheap members fill up to
// their SLO and the rest spills to dearer ones. If every member passes,
// the one with the lowest predicted TTFT takes it. Failing members (error rate
// over the policy's limit) come last. The fallbacks are the others by predicted
// TTFT. A price-blind policy is the same walk with every price equal.
func Rank(cands []Candidate, p Policy, rnd func() float64) []int {
	if len(cands) == 0 {
		return nil
	}
	order := make([]rankEntry, len(cands))
	for i, c := range cands {
		price := c.Price
		if p.PriceBlind {
			price = 0
		}
		order[i] = rankEntry{i: i, price: price, weight: c.Weight, ramp: c.Ramp, predicted: c.Predicted(p),
			failing: p.MaxErrorRate > 0 && c.Requests >= minErrorSamples && c.ErrorRate > p.MaxErrorRate,
			remote:  p.ClientRegion != "" && c.Region != p.ClientRegion}
	}
	slices.SortStableFunc(order, func(a, b rankEntry) int {
		return cmp.Or(boolCmp(a.failing, b.failing), cmp.Compare(a.price, b.price), boolCmp(a.remote, b.remote))
	})
	// Within a tier, members share by weight: each tier is shuffled by
	// weighted sampling.
	first := -1
	for start := 0; start < len(order); {
		end := start + 1
		for end < len(order) && order[start].sameTier(order[end]) {
			end++
		}
		tier := order[start:end]
		weightedShuffle(tier, rnd)
		for k, e := range tier {
			if first >= 0 || e.failing {
				break
			}
			if rnd() < (1-spill(e.predicted, p.SLO))*e.ramp {
				first = start + k
			}
		}
		start = end
	}
	rest := make([]rankEntry, 0, len(order))
	for k, e := range order {
		if k != first {
			rest = append(rest, e)
		}
	}
	// Fallbacks, and the choice when every member passed: healthy before
	// failing, then the fastest — a ramping member's prediction stretched by
	// its ramp, or an idle returning member would win every such choice and
	// take the stampede its ramp is there to prevent.
	slices.SortStableFunc(rest, func(a, b rankEntry) int {
		return cmp.Or(boolCmp(a.failing, b.failing), cmp.Compare(a.rampedPrediction(), b.rampedPrediction()))
	})
	out := make([]int, 0, len(order))
	if first >= 0 {
		out = append(out, order[first].i)
	}
	for _, e := range rest {
		out = append(out, e.i)
	}
	return out
}

type rankEntry struct {
	i               int
	price, weight   float64
	ramp            float64
	predicted       time.Duration
	failing, remote bool
}

func (a rankEntry) rampedPrediction() float64 {
	return float64(a.predicted) / math.Max(a.ramp, 0.01)
}

func (a rankEntry) sameTier(b rankEntry) bool {
	return a.failing == b.failing && a.remote == b.remote && a.price == b.price
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// weightedShuffle orders s by weighted sampling without replacement: heavier
// entries tend to come first, in proportion to their weight.
func weightedShuffle(s []rankEntry, rnd func() float64) {
	for k := 0; k < len(s)-1; k++ {
		total := 0.0
		for _, e := range s[k:] {
			total += math.Max(e.weight, 1e-9)
		}
		x := rnd() * total
		j := k
		for ; j < len(s)-1; j++ {
			x -= math.Max(s[j].weight, 1e-9)
			if x < 0 {
				break
			}
		}
		s[k], s[j] = s[j], s[k]
	}
}
