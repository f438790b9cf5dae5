package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The replicas suite writes its report: the goal at the most replicas, a
// table per scenario with every count shared and not, the delays swept.
func TestReplicasSuiteReport(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	cfg := Config{Suite: ReplicasSuite, Quick: true, Scenarios: []string{"burst-at-once"}, Replicas: []int{1, 2}, SyncDelay: DefaultSyncDelay,
		SyncEvery: DefaultSyncEvery, Out: dir, CommandLine: "kvgate bench --suite replicas"}
	if err := Run(context.Background(), &out, cfg); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## At 2 replicas", "| burst-at-once | —, ", "| 2 | shared | — | ", "| 2 | unshared | — | ",
		"| 1 | `least-request`, for reference |", "What the delay costs", "| 2 | shared at once |", "| 2 | shared 30ms late, every 2ms |",
		"`chat-fixed-speed`, shared at once"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("no %q in report.md:\n%s", want, md)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res []ReplicaResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	// chat ×1, ×2, ×2 shared; least-request ×1; 6 more ways to share; 3
	// without learned speeds.
	if len(res) != 13 {
		t.Fatalf("%d runs, want 13: %s", len(res), raw)
	}
	for _, r := range res {
		if r.Requests != 300 || len(r.MaxInFlightPerEndpoint) != 8 || r.MaxInFlight != slices.Max(r.MaxInFlightPerEndpoint) || r.Shared != (r.SyncDelayMS != nil) {
			t.Errorf("run %+v", r)
		}
	}
}

// The replicas suite runs the scenarios where replicas matter, as their own
// suites define them but for the goals, which are the replicas report's.
func TestReplicasSuiteScenarios(t *testing.T) {
	var others []Scenario
	for _, name := range []string{"aws", "mixed", "tenants"} {
		others = append(others, suite(t, name, false)...)
	}
	var names []string
	for _, s := range suite(t, ReplicasSuite, false) {
		names = append(names, s.Name)
		o := others[slices.IndexFunc(others, func(o Scenario) bool { return o.Name == s.Name })]
		if s.Target != "" || s.Goals != nil || s.Description != o.Description || s.Workload != o.Workload || !reflect.DeepEqual(s.Fleet, o.Fleet) {
			t.Errorf("%s: %+v\nits suite's %+v", s.Name, s, o)
		}
	}
	if want := "shared-prefix,many-tenants-100,burst-at-once,burst-three-speeds,mixed-gpu-stable,uniform-steady"; strings.Join(names, ",") != want {
		t.Fatalf("scenarios %v, want %s", names, want)
	}
}

// The replicas suite refuses what it cannot run, and other suites refuse its
// flag.
func TestReplicasRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"replicas elsewhere", Config{Suite: "aws", Replicas: []int{2}}, "--replicas applies to --suite replicas"},
		{"live", Config{Suite: ReplicasSuite, Mode: "live"}, "virtual time only"},
		{"bench-side policy", Config{Suite: ReplicasSuite, Policies: []string{KubeProxy}}, "has no replicas"},
		{"no replicas", Config{Suite: ReplicasSuite, Replicas: []int{0}}, "0 replicas"},
		{"negative delay", Config{Suite: ReplicasSuite, SyncDelay: -time.Millisecond}, "cannot be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), &bytes.Buffer{}, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
