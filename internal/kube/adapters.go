package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"
)

// BBRManagedLabel marks the ConfigMaps that map LoRA adapters to their base model
// for the body-based router, as GIE's router reads them: data key baseModel (a
// name) and adapters (a YAML list of names).
const BBRManagedLabel = "inference.networking.k8s.io/bbr-managed"

// AdapterSink receives what one ConfigMap (source "namespace/name") says: adapter
// → base model, the base model mapped to itself. An empty map means the
// ConfigMap is gone or says nothing usable.
type AdapterSink func(source string, adapters map[string]string)

// WatchAdapterConfigMaps feeds sink from the ConfigMaps labelled
// BBRManagedLabel=true in namespace ("" for all) until ctx ends. It returns once
// the first list has been delivered, or with the error that prevented it.
func WatchAdapterConfigMaps(ctx context.Context, cfg *rest.Config, namespace string, log *slog.Logger, sink AdapterSink) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = BBRManagedLabel + "=true" }))
	inf := f.Core().V1().ConfigMaps().Informer()
	update := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		m, err := ParseAdapterConfigMap(cm)
		if err != nil {
			log.Warn("ignoring a bbr-managed ConfigMap", "configmap", cm.Namespace+"/"+cm.Name, "err", err)
		}
		sink(cm.Namespace+"/"+cm.Name, m)
	}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				sink(cm.Namespace+"/"+cm.Name, nil)
			}
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("bbr-managed ConfigMaps: %w", context.Cause(ctx))
	}
	return nil
}

// ParseAdapterConfigMap reads one bbr-managed ConfigMap.
func ParseAdapterConfigMap(cm *corev1.ConfigMap) (map[string]string, error) {
	base := cm.Data["baseModel"]
	if base == "" {
		return nil, fmt.Errorf("data.baseModel is missing")
	}
	out := map[string]string{base: base}
	if raw := cm.Data["adapters"]; raw != "" {
		var adapters []string
		if err := yaml.Unmarshal([]byte(raw), &adapters); err != nil {
			return out, fmt.Errorf("data.adapters: want a YAML list of names: %w", err)
		}
		for _, a := range adapters {
			if a != "" {
				out[a] = base
			}
		}
	}
	return out, nil
}
