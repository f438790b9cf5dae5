package route

import (
	"slices"
	"sync"
)

// maxRecentAdapters bounds how many adapters an endpoint's recency list keeps:
// more than any server's adapter slots.
const maxRecentAdapters = 64

// recentAdapters are the LoRA adapters this gateway last sent to an endpoint,
// most recent first: what the server most likely holds loaded. A model
// server's metrics name only the adapters of its running and waiting
// requests, so an adapter loaded but idle is invisible to them, yet loading
// another evicts it; picking by the metrics alone moves adapters from server
// to server, each move a load.
type recentAdapters struct {
	mu   sync.Mutex
	list []string
}

// sent records that a request of adapter went to the endpoint.
func (r *recentAdapters) sent(adapter string) {
	if adapter == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.Index(r.list, adapter); i >= 0 {
		copy(r.list[1:i+1], r.list[:i])
		r.list[0] = adapter
		return
	}
	if len(r.list) < maxRecentAdapters {
		r.list = append(r.list, "")
	}
	copy(r.list[1:], r.list)
	r.list[0] = adapter
}

// held reports whether adapter is among the last slots distinct adapters
// sent, and how many distinct adapters were sent in all (at most slots).
func (r *recentAdapters) held(adapter string, slots int) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(len(r.list), slots)
	return adapter != "" && slices.Contains(r.list[:n], adapter), n
}
