package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestDeadline(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name     string
		samples  []time.Duration
		min, max time.Duration
	}{
		{name: "no answers yet: the floor", min: 200 * ms, max: 200 * ms},
		{name: "fast Redis: the floor", samples: []time.Duration{ms / 2, ms / 3, ms}, min: 200 * ms, max: 200 * ms},
		// A machine slowed to ~150 ms answers: the wait grows past them.
		{name: "slowed Redis: above its answers", samples: []time.Duration{150 * ms, 120 * ms, 180 * ms, 160 * ms, 140 * ms}, min: 200 * ms, max: 500 * ms},
		{name: "a jump is followed at once", samples: []time.Duration{ms, ms, ms, 300 * ms}, min: 300 * ms, max: 2 * time.Second},
		{name: "never beyond the ceiling", samples: []time.Duration{5 * time.Second}, min: 2 * time.Second, max: 2 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDeadline(200*ms, 2*time.Second)
			for _, s := range c.samples {
				d.observe(s)
			}
			if got := d.current(); got < c.min || got > c.max {
				t.Errorf("wait %v after %v, want %v..%v", got, c.samples, c.min, c.max)
			}
		})
	}
	t.Run("backs off while no answer comes, until one does", func(t *testing.T) {
		d := newDeadline(50*ms, time.Second)
		d.observe(ms)
		for _, want := range []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second} {
			d.gaveUp(d.current())
			if got := d.current(); got != want {
				t.Fatalf("after giving up: %v, want %v", got, want)
			}
		}
		d.observe(ms)
		if got := d.current(); got != 50*ms {
			t.Errorf("after an answer: %v, want the floor again", got)
		}
	})
	t.Run("settles back when Redis is fast again", func(t *testing.T) {
		d := newDeadline(50*ms, time.Second)
		d.observe(400 * ms)
		for range 60 {
			d.observe(ms)
		}
		if got := d.current(); got != 50*ms {
			t.Errorf("wait %v after a long run of 1 ms answers, want the 50 ms floor", got)
		}
	})
}

// TestTimedOut: timeouts are congestion or silence, counted toward "no answer
// in MaxTimeout"; refusals and broken connections mark Redis down at once.
func TestTimedOut(t *testing.T) {
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"pool timeout", fmt.Errorf("reserve: %w", redis.ErrPoolTimeout), true},
		{"call deadline", context.DeadlineExceeded, true},
		{"dial timeout", dialTimeout, true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"connection reset", io.EOF, false},
		{"error reply", errors.New("ERR unknown command"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := timedOut(c.err); got != c.want {
				t.Errorf("timedOut(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
