package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of the InferencePool resource.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// SchemeGroupVersion is GroupVersion under the name client-go's conventions use.
var SchemeGroupVersion = GroupVersion

// AddToScheme registers InferencePool and InferencePoolList with a scheme, for
// clients and the controller.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &InferencePool{}, &InferencePoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
