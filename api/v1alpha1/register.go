package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of the resource.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// AddToScheme registers the resource's types with a scheme, for clients and the
// controller.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &InferenceGatewayConfig{}, &InferenceGatewayConfigList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
