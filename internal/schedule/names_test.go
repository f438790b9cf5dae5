package schedule_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/schedule"
)

// TestNamesInStep: the picker, profile and weight names the configuration,
// the CRD and the docs accept are the ones schedule registers.
func TestNamesInStep(t *testing.T) {
	root := filepath.Join("..", "..")
	types, err := os.ReadFile(filepath.Join(root, "api", "v1alpha1", "types.go"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	weights := asStrings(slices.Collect(maps.Keys((v1alpha1.Weights{}).ByName())))
	for _, c := range []struct {
		field      string // the SchedulerSpec field whose CRD enum lists the names
		registered []string
		validated  []string
	}{
		{field: "Picker", registered: schedule.PickerNames(), validated: v1alpha1.Pickers},
		{field: "Profile", registered: asStrings(schedule.ProfileNames()), validated: v1alpha1.Profiles},
		{field: "", registered: asStrings(schedule.WeightNames()), validated: weights},
	} {
		name := c.field
		if name == "" {
			name = "Weights"
		}
		t.Run(name, func(t *testing.T) {
			if !sameSet(c.registered, c.validated) {
				t.Errorf("validation accepts %v, schedule registers %v", c.validated, c.registered)
			}
			if c.field != "" {
				enum := crdEnum(t, string(types), c.field)
				if !sameSet(c.registered, enum) {
					t.Errorf("the CRD's enum for %s is %v, schedule registers %v", c.field, enum, c.registered)
				}
			}
			for _, n := range c.registered {
				if !strings.Contains(string(docs), n) {
					t.Errorf("docs/configuration.md never names %q", n)
				}
			}
		})
	}
}

// crdEnum reads the +kubebuilder:validation:Enum marker above a field of
// types.go, from which the CRD is generated (make verify-generate keeps the
// two alike).
func crdEnum(t *testing.T, src, field string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?s)\+kubebuilder:validation:Enum=([^\n]+)\n(?:\s*//[^\n]*\n)*\s*` + field + ` `).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("no enum marker above %s in types.go", field)
	}
	return strings.Split(strings.TrimSpace(m[1]), ";")
}

// asStrings converts typed names to strings.
func asStrings[T ~string](names []T) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = string(n)
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}
