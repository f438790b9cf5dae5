package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Progress goes to a terminal only: not to a buffer, a file or a pipe.
func TestProgressOnlyOnATerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(); _ = w.Close() }()
	for name, stderr := range map[string]io.Writer{"buffer": &bytes.Buffer{}, "file": f, "pipe": w} {
		if p := progress(stderr); p != nil {
			t.Errorf("%s: progress goes to %v", name, p)
		}
	}
}

// bench's and tune's --suite help name every suite, and an unknown suite's
// error lists them.
func TestSuiteFlagNamesSuites(t *testing.T) {
	for _, cmd := range []string{"bench", "tune"} {
		out, err := run(t, cmd, "--help")
		if err != nil || !strings.Contains(out, "aws, mixed") {
			t.Errorf("%s --help: %v\n%s", cmd, err, out)
		}
	}
	if _, err := run(t, "bench", "--suite", "azure"); err == nil || !strings.Contains(err.Error(), `unknown suite "azure" (known: aws, mixed)`) {
		t.Fatalf("bench --suite azure: %v", err)
	}
}
