package proxy

import "sync/atomic"

// Budget bounds the request bytes held in memory across all requests: the
// heads read to find the model and the recordings kept for a retry. Each
// request takes its share through a Hold and gives it all back when done.
// Reserving is one atomic add: it is on every request's path.
type Budget struct {
	used atomic.Int64
	// OnChange, when set, is told the bytes held after each change, and how
	// many a release gave back (0 for a reservation).
	OnChange func(used, released int64)
}

// Used is how many bytes are reserved now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Hold starts a request's share of b, within limit bytes in all (<= 0:
// unbounded).
func (b *Budget) Hold(limit int64) *Hold { return &Hold{b: b, limit: limit} }

// Hold is one request's share of a Budget. Its methods may be called from
// the handler and from the transport reading the body.
type Hold struct {
	b     *Budget
	limit int64
	n     atomic.Int64
}

// Reserve takes n more bytes, or reports false and takes nothing when the
// budget cannot spare them.
func (h *Hold) Reserve(n int64) bool {
	if n <= 0 {
		return true
	}
	used := h.b.used.Add(n)
	if h.limit > 0 && used > h.limit {
		h.b.used.Add(-n)
		return false
	}
	h.n.Add(n)
	if h.b.OnChange != nil {
		h.b.OnChange(used, 0)
	}
	return true
}

// Release gives n of the bytes back.
func (h *Hold) Release(n int64) {
	if n <= 0 {
		return
	}
	h.n.Add(-n)
	used := h.b.used.Add(-n)
	if h.b.OnChange != nil {
		h.b.OnChange(used, n)
	}
}

// Done gives back everything the request still holds.
func (h *Hold) Done() {
	if n := h.n.Swap(0); n > 0 {
		used := h.b.used.Add(-n)
		if h.b.OnChange != nil {
			h.b.OnChange(used, n)
		}
	}
}
