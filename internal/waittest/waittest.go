// Package waittest waits in tests for a condition that other goroutines or
// processes bring about.
package waittest

import (
	"testing"
	"time"
)

// Until polls cond every few milliseconds until it holds, and fails the test
// when it still does not after timeout.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
