package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/schedule"
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
		if err != nil || !strings.Contains(out, "aws, mixed, tenants, replicas") {
			t.Errorf("%s --help: %v\n%s", cmd, err, out)
		}
	}
	if _, err := run(t, "bench", "--suite", "azure"); err == nil || !strings.Contains(err.Error(), `unknown suite "azure" (known: aws, mixed, tenants, replicas)`) {
		t.Fatalf("bench --suite azure: %v", err)
	}
}

// bench's help documents the replicas suite's flags with their defaults, and
// --replicas belongs to that suite alone.
func TestBenchReplicasFlags(t *testing.T) {
	out, err := run(t, "bench", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--suite replicas", "--replicas ints", "--sync-delay duration", "(default 500µs)", "--sync-every duration"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --help: no %q\n%s", want, out)
		}
	}
	if _, err := run(t, "bench", "--replicas", "2"); err == nil || !strings.Contains(err.Error(), "--replicas applies to --suite replicas") {
		t.Fatalf("bench --replicas 2 on the aws suite: %v", err)
	}
}

// tune's help lists, from the registry, each scorer it searches with what the
// scorer prefers, and every profile it can start from.
func TestTuneHelpFromRegistry(t *testing.T) {
	out, err := run(t, "tune", "--help")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range bench.TunedScorers() {
		want = append(want, string(s.Name)+" ", s.Description)
	}
	for _, p := range schedule.ProfileNames() {
		want = append(want, string(p))
	}
	if len(want) < 4 {
		t.Fatalf("only %v to look for", want)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("tune --help: no %q\n%s", w, out)
		}
	}
}
