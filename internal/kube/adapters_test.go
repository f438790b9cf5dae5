package kube

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/internal/waittest"
)

// TestAdapterConfigMaps: the body-based router's adapter mappings follow the
// bbr-managed ConfigMaps of a namespace as they are created, edited and deleted;
// unlabelled ConfigMaps and other namespaces are ignored, a malformed one is
// reported and maps only its base model.
func TestAdapterConfigMaps(t *testing.T) {
	k := startCluster(t)
	k.namespace(t, "models")
	k.namespace(t, "other")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	got := map[string]map[string]string{}
	snapshot := func() map[string]map[string]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
	cm := func(ns, name string, labelled bool, data map[string]string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
		if labelled {
			c.Labels = map[string]string{BBRManagedLabel: "true"}
		}
		if err := k.c.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	llama := cm("models", "llama", true, map[string]string{"baseModel": "meta-llama/Llama-3.1-8B-Instruct", "adapters": "- sql-lora\n- chat-lora\n"})
	cm("models", "unlabelled", false, map[string]string{"baseModel": "x", "adapters": "- y\n"})
	cm("other", "elsewhere", true, map[string]string{"baseModel": "z"})
	cm("models", "broken", true, map[string]string{"baseModel": "qwen", "adapters": "sql-lora: [unclosed"})
	err := WatchAdapterConfigMaps(ctx, k.cfg, "models", quiet, func(source string, adapters map[string]string) {
		mu.Lock()
		defer mu.Unlock()
		if len(adapters) == 0 {
			delete(got, source)
		} else {
			got[source] = adapters
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first list is delivered before the watch returns.
	now := snapshot()
	want := map[string]string{"meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct", "sql-lora": "meta-llama/Llama-3.1-8B-Instruct", "chat-lora": "meta-llama/Llama-3.1-8B-Instruct"}
	if len(now) != 2 || !maps.Equal(now["models/llama"], want) || !maps.Equal(now["models/broken"], map[string]string{"qwen": "qwen"}) {
		t.Fatalf("after the first list: %v", now)
	}

	llama.Data["adapters"] = "- sql-lora\n"
	if err := k.c.Update(ctx, llama); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the edit to show", func() bool { _, ok := snapshot()["models/llama"]["chat-lora"]; return !ok })
	if err := k.c.Delete(ctx, llama); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the deletion to show", func() bool { _, ok := snapshot()["models/llama"]; return !ok })
}
