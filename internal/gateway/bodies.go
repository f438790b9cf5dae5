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
type bodyMemory struct {
	once   sync.Once
	budget proxy.Budget
	// pending: a return to the OS is scheduled.
	pending atomic.Bool
}

// freeAfter is how long after a large body's release the memory goes back to
// the OS: releases within it share one return (a full GC).
const freeAfter = time.Second

// largeRelease is the release that is worth a return to the OS.
const largeRelease = 16 << 20

// hold starts a request's share of the budget, limit bytes across requests.
func (b *bodyMemory) hold(limit int64, m *telemetry.Gateway) *proxy.Hold {
	b.once.Do(func() {
		b.budget.OnChange = func(used, released int64) {
			m.Buffered.Set(float64(used))
			if released >= largeRelease && b.pending.CompareAndSwap(false, true) {
				time.AfterFunc(freeAfter, func() {
					b.pending.Store(false)
					debug.FreeOSMemory()
				})
			}
		}
	})
	return b.budget.Hold(limit)
}
