package route

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/schedule"
)

func TestWaitQueue(t *testing.T) {
	a, b := &endpoint{addr: "a"}, &endpoint{addr: "b"}
	p := &scheduler{endpoints: []*endpoint{a, b}}
	cands := func() []schedule.Endpoint { return []schedule.Endpoint{{Address: "a"}, {Address: "b"}} }
	addrs := func(c []schedule.Endpoint) (s []string) {
		for _, e := range c {
			s = append(s, e.Address)
		}
		return s
	}
	var q waitQueue
	q.add([]*endpoint{a, b}, 0)
	q.add([]*endpoint{a}, 5) // a higher one that can use a only (a subset hint)
	if got := addrs(q.usable(p, cands(), 0)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("priority 0 may use %v, want [b]: a is for the 5 waiting", got)
	}
	if got := addrs(q.usable(p, cands(), 5)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("priority 5 may use %v, want both", got)
	}
	q.add([]*endpoint{a}, 5)
	if q.remove([]*endpoint{a}, 5) {
		t.Fatal("another 5 still waits for a: the 0 must keep deferring, no wake-up")
	}
	if !q.remove([]*endpoint{a}, 5) {
		t.Fatal("the last 5 left a with the 0 waiting: it must look again")
	}
	if q.remove([]*endpoint{a, b}, 0) || q.n.Load() != 0 || len(q.by) != 0 {
		t.Fatalf("after everyone left: %d waiting, %v kept", q.n.Load(), q.by)
	}
}
