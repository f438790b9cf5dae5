package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "kvgate ") {
		t.Fatalf("version: %q, %v", out, err)
	}
}

func TestHelpEverywhere(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"sim", "--help"}, {"sim", "calibrate", "--help"}, {"demo", "--help"}, {"version", "--help"}} {
		out, err := run(t, args...)
		if err != nil || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("KVGATE_GPU", "tpu-v9")
	_, err := run(t, "sim", "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), `unknown gpu "tpu-v9"`) {
		t.Fatalf("KVGATE_GPU not applied: %v", err)
	}
	// The command line wins over the environment.
	t.Setenv("KVGATE_MAX_LORAS", "not-a-number")
	if _, err := run(t, "sim", "--max-loras", "2", "--gpu", "h100", "--model-size", "900b"); err == nil || !strings.Contains(err.Error(), "unknown model size") {
		t.Fatalf("want the model-size error, got %v", err)
	}
	t.Setenv("KVGATE_MAX_LORAS", "x")
	if _, err := run(t, "sim", "--gpu", "h100"); err == nil || !strings.Contains(err.Error(), "KVGATE_MAX_LORAS") {
		t.Fatalf("a bad environment value must name the variable: %v", err)
	}
}

func TestSimRejectsBadFleetFile(t *testing.T) {
	if _, err := run(t, "sim", "--fleet", "/nonexistent.yaml"); err == nil {
		t.Fatal("missing fleet file accepted")
	}
}

// docs/simulator.md quotes `kvgate sim calibrate`; this keeps the copy current.
func TestSimulatorDocQuotesCalibration(t *testing.T) {
	doc, err := os.ReadFile("../../docs/simulator.md")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeCalibration(&out); err != nil {
		t.Fatal(err)
	}
	for _, table := range strings.Split(strings.TrimSpace(out.String()), "\n\n") {
		if !strings.Contains(string(doc), table) {
			t.Errorf("docs/simulator.md does not hold the current table; rerun `kvgate sim calibrate` and paste:\n%s", table)
		}
	}
}
