// Package routetest holds routing cores for the fronts' tests.
package routetest

import (
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/route"
)

// Reloading is a routing core that applies another configuration (Next)
// right after each request takes its own: every later step of that request
// runs after a reload, which a front must not see.
type Reloading struct {
	*route.Router
	Next func(n int) *v1alpha1.InferenceGatewayConfig
	// Taken counts the configurations requests took.
	Taken atomic.Int64

	mu  sync.Mutex
	err error
}

// Current is the configuration serving now; a reload follows at once.
func (r *Reloading) Current() route.Config {
	c := r.Router.Current()
	n := r.Taken.Add(1)
	if err := r.Apply(r.Next(int(n))); err != nil {
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	}
	return c
}

// Err is the first reload that failed, if one did.
func (r *Reloading) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}
