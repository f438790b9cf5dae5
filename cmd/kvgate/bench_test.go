package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
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
