package sim

import (
	"container/heap"
	"time"
)

// Arrival is a request arriving at a virtual time.
type Arrival struct {
	At  time.Duration
	Req Request
}

// Fleet steps many engines on one virtual timeline: the engine whose step ends
// first goes next, and each arrival is routed when its time comes.
//
// Whoever routes must not see the future. An engine runs a whole step at once,
// so its state after the step is ahead of the clock until the step's end: events
// a step produces (first tokens, completions) are delivered at the step's end
// time, in time order with arrivals and ticks, and GaugesAt reads an engine as
// it was when its step in progress began.
type Fleet struct {
	Engines []*Engine
	// OnFirstToken, when set, is called as each sequence produces its first token.
	OnFirstToken func(engine int, s *Seq)
	// NextTick and OnTick, when set, add timed events (a gateway's metric
	// scrapes): OnTick(t) runs when virtual time reaches the t NextTick reports;
	// it must move NextTick on. Ticks alone do not keep Run going.
	NextTick func() (time.Duration, bool)
	OnTick   func(t time.Duration)
	// Adapters makes GaugesAt list adapters.
	Adapters bool

	busy    engineHeap
	pending callbackHeap
	before  []Gauges // each engine as its last step began
	seq     uint64
}

// NewFleet builds a fleet of engines.
func NewFleet(engines []*Engine) *Fleet {
	return &Fleet{Engines: engines, busy: engineHeap{pos: make([]int, len(engines)), engines: engines}, before: make([]Gauges, len(engines))}
}

// GaugesAt reads engine i as a scrape at time t would: mid-step, as the step
// began.
func (f *Fleet) GaugesAt(i int, t time.Duration) Gauges {
	if e := f.Engines[i]; e.Now() > t {
		return f.before[i]
	}
	return f.Engines[i].Gauges(f.Adapters)
}

// Run feeds arrivals, sorted by time, to the engine route picks for each, and steps
// the engines until every request has finished. route may return -1 to drop an
// arrival (the caller accounts for it). finished is called for each sequence as it
// ends, at the end of the step that ended it. Run returns the virtual time at
// which the last step ended.
func (f *Fleet) Run(arrivals []Arrival, route func(Arrival) int, finished func(engine int, s *Seq)) (time.Duration, error) {
	for i := range f.busy.pos {
		f.busy.pos[i] = -1
	}
	f.busy.ids = f.busy.ids[:0]
	f.pending = f.pending[:0]
	const never = time.Duration(1<<63 - 1)
	var end time.Duration
	next := 0
	for next < len(arrivals) || f.busy.Len() > 0 || len(f.pending) > 0 {
		ta, tt, ts, tp := never, never, never, never
		if next < len(arrivals) {
			ta = arrivals[next].At
		}
		if f.NextTick != nil {
			if t, ok := f.NextTick(); ok {
				tt = t
			}
		}
		if f.busy.Len() > 0 {
			ts = f.Engines[f.busy.ids[0]].Now()
		}
		if len(f.pending) > 0 {
			tp = f.pending[0].at
		}
		switch {
		case tp <= min(tt, ta, ts):
			c := heap.Pop(&f.pending).(callback)
			if c.first {
				f.OnFirstToken(c.engine, c.seq)
			} else if finished != nil {
				finished(c.engine, c.seq)
			}
		case tt <= min(ta, ts):
			f.OnTick(tt)
		case ta <= ts:
			a := arrivals[next]
			next++
			i := route(a)
			if i < 0 {
				continue
			}
			e := f.Engines[i]
			if !e.Busy() {
				e.AdvanceTo(a.At)
			}
			if _, err := e.SubmitAt(a.Req, a.At); err != nil {
				return end, err
			}
			if f.busy.pos[i] < 0 {
				heap.Push(&f.busy, i)
			}
		default:
			i := f.busy.ids[0]
			e := f.Engines[i]
			if f.NextTick != nil {
				f.before[i] = e.Gauges(f.Adapters)
			}
			r := e.Step()
			end = max(end, r.End)
			if f.OnFirstToken != nil {
				for _, s := range r.Emitted {
					if s.Generated == 1 {
						f.push(callback{at: r.End, engine: i, seq: s, first: true})
					}
				}
			}
			for _, s := range r.Finished {
				f.push(callback{at: r.End, engine: i, seq: s})
			}
			if e.Busy() {
				heap.Fix(&f.busy, 0)
			} else {
				heap.Pop(&f.busy)
			}
		}
	}
	return end, nil
}

func (f *Fleet) push(c callback) {
	f.seq++
	c.order = f.seq
	heap.Push(&f.pending, c)
}

// callback is an event a step produced, due at the step's end.
type callback struct {
	at     time.Duration
	order  uint64 // ties: first tokens before completions, in production order
	engine int
	seq    *Seq
	first  bool
}

type callbackHeap []callback

func (h callbackHeap) Len() int { return len(h) }
func (h callbackHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].order < h[j].order
}
func (h callbackHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *callbackHeap) Push(x any)   { *h = append(*h, x.(callback)) }
func (h *callbackHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// engineHeap orders busy engines by the end of their current step.
type engineHeap struct {
	ids     []int
	pos     []int // index in ids, -1 when not busy
	engines []*Engine
}

func (h *engineHeap) Len() int { return len(h.ids) }
func (h *engineHeap) Less(a, b int) bool {
	return h.engines[h.ids[a]].Now() < h.engines[h.ids[b]].Now()
}
func (h *engineHeap) Swap(a, b int) {
	h.ids[a], h.ids[b] = h.ids[b], h.ids[a]
	h.pos[h.ids[a]] = a
	h.pos[h.ids[b]] = b
}
func (h *engineHeap) Push(x any) {
	i := x.(int)
	h.pos[i] = len(h.ids)
	h.ids = append(h.ids, i)
}
func (h *engineHeap) Pop() any {
	i := h.ids[len(h.ids)-1]
	h.ids = h.ids[:len(h.ids)-1]
	h.pos[i] = -1
	return i
}
