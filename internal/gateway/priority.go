package gateway

import "sync"

// ObjectiveHeader names the request's objective (the Gateway API Inference
// Extension's InferenceObjective), whose priority spec.objectives gives.
const ObjectiveHeader = "X-Gateway-Inference-Objective"

// priorityOf is the priority of the objective a request names: 0 when it names
// none or one the configuration does not list.
func (rt *routes) priorityOf(objective string) int32 {
	if objective == "" {
		return 0
	}
	return rt.objectives[objective]
}

// waitQueue counts the requests waiting for a free endpoint, by pool and
// priority, so that a freed slot goes to the most important request waiting.
// Pools are keyed by name: a reload rebuilds them while requests wait.
type waitQueue struct {
	mu sync.Mutex
	n  map[string]map[int32]int
}

func (q *waitQueue) add(pool string, prio int32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == nil {
		q.n = map[string]map[int32]int{}
	}
	if q.n[pool] == nil {
		q.n[pool] = map[int32]int{}
	}
	q.n[pool][prio]++
}

// remove takes a waiter out and reports whether requests of lower priority
// still wait: they deferred to it and must look again.
func (q *waitQueue) remove(pool string, prio int32) (lowerWaiting bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	byPrio := q.n[pool]
	if byPrio[prio]--; byPrio[prio] <= 0 {
		delete(byPrio, prio)
	}
	if len(byPrio) == 0 {
		delete(q.n, pool)
	}
	for p := range byPrio {
		if p < prio {
			return true
		}
	}
	return false
}

// ahead says whether a request of a higher priority than prio waits for the
// pool: one of prio then lets it take a freed slot first.
func (q *waitQueue) ahead(pool string, prio int32) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for p, n := range q.n[pool] {
		if p > prio && n > 0 {
			return true
		}
	}
	return false
}
