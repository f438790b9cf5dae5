package schedule

import "slices"

// The names users write: the pickers here, the profiles and weights in the
// registry (registry.go). The CRD's enums, configuration validation, the
// bench, tune and docs/configuration.md are checked against them
// (names_test.go), so none of them can name something the router lacks.

// PickerKvgate is the GPU-aware picker: the weighted scorers of a profile.
const PickerKvgate = "kvgate"

// Baselines are the pickers that need no weights, as New builds them.
var Baselines = []string{"least-request", "round-robin", "random", "power-of-two"}

// PickerNames are the values of a scheduler's picker: kvgate, then the
// baselines.
func PickerNames() []string { return append([]string{PickerKvgate}, Baselines...) }

// IsBaseline reports whether name is a picker that needs no weights.
func IsBaseline(name string) bool { return slices.Contains(Baselines, name) }
