package schedule

import (
	"maps"
	"slices"
)

// The names users write: every picker, profile and weight name kvgate accepts
// is registered here once. The CRD's enums, configuration validation, the
// bench, tune and docs/configuration.md are checked against these lists
// (names_test.go), so none of them can name something the router lacks.

// PickerKvgate is the GPU-aware picker: the weighted scorers of a profile.
const PickerKvgate = "kvgate"

// Baselines are the pickers that need no weights, as New builds them.
var Baselines = []string{"least-request", "round-robin", "random", "power-of-two"}

// PickerNames are the values of a scheduler's picker: kvgate, then the
// baselines.
func PickerNames() []string { return append([]string{PickerKvgate}, Baselines...) }

// ProfileNames are the values of a scheduler's profile: "kvgate" (the
// default profile), then the built-in profiles in order of name.
func ProfileNames() []string {
	return append([]string{PickerKvgate}, slices.Sorted(maps.Keys(profiles))...)
}

// WeightNames are the scorers a profile's weights can name, in Scores order
// (ScoreNames without inFlight, which only the baselines rank by).
func WeightNames() []string { return slices.Clone(ScoreNames[:len(ScoreNames)-1]) }

// IsBaseline reports whether name is a picker that needs no weights.
func IsBaseline(name string) bool { return slices.Contains(Baselines, name) }
