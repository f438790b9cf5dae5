package route

import (
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// TestBuild: building a table changes nothing it reads (the registries that
// outlive reloads, the table serving now); a scheduler whose settings did not
// change keeps its picker and transport; one whose settings changed gets new
// ones; endpoints the registry holds are reused, the others are listed fresh.
func TestBuild(t *testing.T) {
	mk := func(schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
		return &v1alpha1.InferenceGatewayConfig{Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: schedulers}}
	}
	sessions := schedulerSpec("b", "qwen", "10.0.0.3:8000")
	sessions.SessionAffinity = &v1alpha1.SessionAffinitySpec{FromUser: true}
	first, err := build(mk(schedulerSpec("a", llama, "10.0.0.1:8000"), sessions), nil, buildEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.fresh) != 2 || len(first.sessions) != 1 || len(first.targets) != 2 {
		t.Fatalf("first table: %d fresh endpoints, %d session maps, %d targets; want 2, 1, 2", len(first.fresh), len(first.sessions), len(first.targets))
	}
	if !first.rt.wantsUser || first.rt.byModel["qwen"] == nil || first.rt.byModel[llama] == nil {
		t.Fatalf("first table: wantsUser %v, models %v", first.rt.wantsUser, first.rt.byModel)
	}
	// The registries as install would leave them.
	endpoints := map[string]*endpoint{}
	for k, e := range first.fresh {
		endpoints[k] = e
	}
	sessionMaps := map[string]*sessionMap{"b": first.sessions["b"]}

	changed := schedulerSpec("b", "qwen", "10.0.0.3:8000")
	changed.Picker = "round-robin"
	next, err := build(mk(schedulerSpec("a", llama, "10.0.0.1:8000", "10.0.0.2:8000"), changed), first.rt,
		buildEnv{endpoints: endpoints, sessions: sessionMaps})
	if err != nil {
		t.Fatal(err)
	}
	if len(endpoints) != 2 || len(sessionMaps) != 1 || len(first.rt.schedulers[0].endpoints) != 1 {
		t.Fatal("build changed what it read")
	}
	a, b := next.rt.schedulers[0], next.rt.schedulers[1]
	if a.picker != first.rt.schedulers[0].picker || a.transport != first.rt.schedulers[0].transport || !next.kept[a.transport] {
		t.Error("a scheduler whose endpoints alone changed got a new picker or transport")
	}
	if b.picker == first.rt.schedulers[1].picker || b.transport == first.rt.schedulers[1].transport {
		t.Error("a scheduler whose picker changed kept the old one")
	}
	if a.endpoints[0] != endpoints["a|10.0.0.1:8000"] {
		t.Error("an endpoint the registry holds was not reused")
	}
	if len(next.fresh) != 1 || next.fresh["a|10.0.0.2:8000"] == nil {
		t.Errorf("fresh endpoints %v, want the new address alone", next.fresh)
	}
	if b.sessions != nil || next.rt.wantsUser {
		t.Error("session affinity outlived the scheduler that dropped it")
	}
}
