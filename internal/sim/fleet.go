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
type Fleet struct {
	Engines []*Engine
	// OnFirstToken, when set, is called as each sequence produces its first token.
	OnFirstToken func(engine int, s *Seq)
	busy         engineHeap
}

// NewFleet builds a fleet of engines.
func NewFleet(engines []*Engine) *Fleet {
	return &Fleet{Engines: engines, busy: engineHeap{pos: make([]int, len(engines)), engines: engines}}
}

// Run feeds arrivals, sorted by time, to the engine route picks for each, and steps
// the engines until every request has finished. route may return -1 to drop an
// arrival (the caller accounts for it). finished is called for each sequence as it
// ends. Run returns the virtual time at which the last step ended.
func (f *Fleet) Run(arrivals []Arrival, route func(Arrival) int, finished func(engine int, s *Seq)) (time.Duration, error) {
	for i := range f.busy.pos {
		f.busy.pos[i] = -1
	}
	f.busy.ids = f.busy.ids[:0]
	var end time.Duration
	next := 0
	for next < len(arrivals) || f.busy.Len() > 0 {
		if next < len(arrivals) && (f.busy.Len() == 0 || arrivals[next].At <= f.Engines[f.busy.ids[0]].Now()) {
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
			continue
		}
		i := f.busy.ids[0]
		e := f.Engines[i]
		r := e.Step()
		end = max(end, r.End)
		if f.OnFirstToken != nil {
			for _, s := range r.Emitted {
				if s.Generated == 1 {
					f.OnFirstToken(i, s)
				}
			}
		}
		if finished != nil {
			for _, s := range r.Finished {
				finished(i, s)
			}
		}
		if e.Busy() {
			heap.Fix(&f.busy, 0)
		} else {
			heap.Pop(&f.busy)
		}
	}
	return end, nil
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
