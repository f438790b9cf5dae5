package gateway

import (
	"errors"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/telemetry"
)

// errOverBudget ends the scan of a body whose head would take the bytes held
// past spec.gateway.maxBufferedBytes.
var errOverBudget = errors.New("request bodies held past maxBufferedBytes")

// overBudget is the answer to such a request: nothing went upstream, and
// another try may find room.
var overBudget = &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer,
	Message: "the gateway holds too many request bodies to take this one now; retry later", RetryAfter: 1, Close: true}

// bodyMemory is the gateway's budget for request bodies, and gives memory
// back to the OS after large ones: Go's heap keeps freed spans for minutes
// when the gateway goes quiet, and a burst of 100 MB bodies would otherwise
// leave the process that large long after.
//
// Heads are copied into chunks of chunkSize that go back to a pool when their
// request ends: a body refused half-read, or served, leaves its chunks to the
// next large head rather than to the garbage collector, whose slack (the heap
// grows to twice what was live) would otherwise double the budget.
type bodyMemory struct {
	once   sync.Once
	budget proxy.Budget
	chunks sync.Pool // *[]byte of chunkSize
	// pending: a return to the OS is scheduled.
	pending atomic.Bool
	// since counts the bytes released since the last return: many
	// mid-sized bodies free as much as one large one.
	since atomic.Int64
}

// scanBuffer bounds the scan's own buffer (openai's spill point, grown
// once): reserved while a body is scanned, so that many bodies stalled
// mid-head cannot hold memory the budget does not count.
const scanBuffer = 1 << 20

// chunkSize is the piece a head is held in past the scan's buffer.
const chunkSize = 256 << 10

// headParts is a request's head past the scan's buffer, in chunks.
type headParts struct {
	m      *bodyMemory
	hold   *proxy.Hold
	chunks []*[]byte
	parts  [][]byte // the filled part of each chunk
}

// add copies p into the chunks, reserving each new one from the budget.
func (h *headParts) add(p []byte) error {
	for len(p) > 0 {
		if n := len(h.parts); n == 0 || len(h.parts[n-1]) == chunkSize {
			if !h.hold.Reserve(chunkSize) {
				return errOverBudget
			}
			c, _ := h.m.chunks.Get().(*[]byte)
			if c == nil {
				b := make([]byte, chunkSize)
				c = &b
			}
			h.chunks = append(h.chunks, c)
			h.parts = append(h.parts, (*c)[:0])
		}
		last := &h.parts[len(h.parts)-1]
		n := copy((*last)[len(*last):chunkSize], p)
		*last, p = (*last)[:len(*last)+n], p[n:]
	}
	return nil
}

// size is how many bytes the chunks hold.
func (h *headParts) size() int64 {
	n := int64(0)
	for _, p := range h.parts {
		n += int64(len(p))
	}
	return n
}

// done gives the chunks back for reuse: nothing may read them after.
func (h *headParts) done() {
	for _, c := range h.chunks {
		h.m.chunks.Put(c)
	}
	h.chunks, h.parts = nil, nil
}

// freeAfter is how long after a large body's release the memory goes back to
// the OS: releases within it share one return (a full GC).
const freeAfter = time.Second

// largeRelease is how much released memory is worth a return to the OS.
const largeRelease = 16 << 20

// hold starts a request's share of the budget, limit bytes across requests.
func (b *bodyMemory) hold(limit int64, m *telemetry.Gateway) *proxy.Hold {
	b.once.Do(func() {
		b.budget.OnChange = func(used, released int64) {
			m.Buffered.Set(float64(used))
			if released > 0 && b.since.Add(released) >= largeRelease && b.pending.CompareAndSwap(false, true) {
				time.AfterFunc(freeAfter, func() {
					b.since.Store(0)
					b.pending.Store(false)
					// Twice: the chunk pool keeps what one collection drops
					// until the next.
					debug.FreeOSMemory()
					debug.FreeOSMemory()
				})
			}
		}
	})
	return b.budget.Hold(limit)
}
