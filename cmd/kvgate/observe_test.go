package main

import (
	"strings"
	"testing"
)

// TestAccessLogFlag: a bad --access-log stops serve, epp and global before
// they start, naming what is accepted.
func TestAccessLogFlag(t *testing.T) {
	for _, cmd := range []string{"serve", "epp", "global"} {
		t.Run(cmd, func(t *testing.T) {
			_, err := run(t, cmd, "--config", "/nonexistent.yaml", "--access-log", "sometimes")
			if err == nil || !strings.Contains(err.Error(), "want off, on or sampled=N") {
				t.Fatalf("--access-log sometimes: %v", err)
			}
		})
	}
}
