package route

import (
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/internal/schedule"
)

// priorityOf is the priority of the objective a request names: 0 when it names
// none or one the configuration does not list.
func (rt *routes) priorityOf(objective string) int32 { return rt.objectives[objective] }

// waitQueue counts the requests waiting for a free slot, by the endpoints each
// could use and its priority, so that a slot freed on an endpoint goes to the
// most important request that can use it. Endpoints outlive reloads while their
// address stays, and so do their waiters.
type waitQueue struct {
	n  atomic.Int64 // registered waiters: with none, nobody defers and no lock is taken
	mu sync.Mutex
	by map[*endpoint]map[int32]int
}

// add registers a waiter of priority prio for each of eps.
func (q *waitQueue) add(eps []*endpoint, prio int32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.by == nil {
		q.by = map[*endpoint]map[int32]int{}
	}
	for _, ep := range eps {
		if q.by[ep] == nil {
			q.by[ep] = map[int32]int{}
		}
		q.by[ep][prio]++
	}
	q.n.Add(1)
}

// remove takes a waiter out and reports whether, on one of its endpoints, it
// was the last of the highest priority waiting while lower ones remain: those
// deferred to it and must look again.
func (q *waitQueue) remove(eps []*endpoint, prio int32) (wake bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n.Add(-1)
	for _, ep := range eps {
		byPrio := q.by[ep]
		if byPrio[prio]--; byPrio[prio] > 0 {
			continue
		}
		delete(byPrio, prio)
		top, lower := true, false
		for p := range byPrio {
			top = top && p < prio
			lower = lower || p < prio
		}
		wake = wake || (top && lower)
		if len(byPrio) == 0 {
			delete(q.by, ep)
		}
	}
	return wake
}

// usable drops from cands the endpoints a request of a higher priority than
// prio waits for: the request lets it take them first.
func (q *waitQueue) usable(p *scheduler, cands []schedule.Endpoint, prio int32) []schedule.Endpoint {
	if q.n.Load() == 0 {
		return cands
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	out := cands[:0]
	for _, c := range cands {
		if !q.higher(p.endpoint(c.Address), prio) {
			out = append(out, c)
		}
	}
	return out
}

func (q *waitQueue) higher(ep *endpoint, prio int32) bool {
	for p, n := range q.by[ep] {
		if p > prio && n > 0 {
			return true
		}
	}
	return false
}
