package schedule

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/kvgate/kvgate/api/v1alpha1"
)

// The registry: every scorer, filter and profile of the weighted picker, once,
// under its name. The picker, configuration validation (through the names of
// api/v1alpha1), kvgate tune, the bench and the plugin metrics read these
// tables; adding a scorer is its type, its line in scorers, and its weight in
// api/v1alpha1.Weights (registry_test.go checks the two agree).

// ScorerSpec describes a scorer.
type ScorerSpec struct {
	Name v1alpha1.ScorerName
	// New builds the scorer for a profile (the load scorers take its spreads).
	New func(Profile) Scorer
	// Prefix says the scorer reads the request's prefix affinity: a scheduler
	// that weighs it hashes prompts and keeps a prefix index.
	Prefix bool
	// Tuned says kvgate tune searches the scorer's weight: the simulated fleet
	// exercises it (that fleet never fails, and its traces carry no session
	// keys).
	Tuned bool
	// Description says in a line what the scorer prefers, for help and docs.
	Description string
}

// scorers are the scorers in the order the picker runs them and Scores holds
// their values.
var scorers = [...]ScorerSpec{
	{Name: v1alpha1.ScorerQueue, New: func(p Profile) Scorer { return Queue{Spread: p.QueueSpread} }, Tuned: true,
		Description: "fewest requests waiting in the model server's queue"},
	{Name: v1alpha1.ScorerKVCache, New: func(Profile) Scorer { return KVCache{} }, Tuned: true,
		Description: "most free KV cache"},
	{Name: v1alpha1.ScorerPrefix, New: func(Profile) Scorer { return Prefix{} }, Prefix: true, Tuned: true,
		Description: "most of the prompt's leading blocks believed cached at the endpoint"},
	{Name: v1alpha1.ScorerLoRAAffinity, New: func(Profile) Scorer { return LoRAAffinity{} }, Tuned: true,
		Description: "the request's LoRA adapter loaded, or a free slot to load it"},
	{Name: v1alpha1.ScorerRunningRequests, New: func(p Profile) Scorer { return RunningRequests{Spread: p.RunningSpread} }, Tuned: true,
		Description: "smallest running batch"},
	{Name: v1alpha1.ScorerPrefillQueue, New: func(p Profile) Scorer { return PrefillQueue{Spread: p.PrefillSpread} }, Tuned: true,
		Description: "fewest prompt tokens this gateway sent that await their first token"},
	{Name: v1alpha1.ScorerErrorRate, New: func(Profile) Scorer { return ErrorRate{Spread: ErrorRateSpread} },
		Description: "fewest failed answers of late"},
	// predictedLatency counts a cached prefix as no prefill work.
	{Name: v1alpha1.ScorerPredictedLatency, New: func(Profile) Scorer { return PredictedLatency{} }, Prefix: true, Tuned: true,
		Description: "shortest time to first token predicted from the endpoint's learned speed"},
	{Name: v1alpha1.ScorerSessionAffinity, New: func(Profile) Scorer { return SessionAffinity{} },
		Description: "the endpoint that served the request's session, within its share of the load"},
	// The peers' scorers read the prefix match for the request's uncached
	// tokens.
	{Name: v1alpha1.ScorerTokenLoad, New: func(Profile) Scorer { return TokenLoad{} }, Prefix: true,
		Description: "fewest uncached prompt tokens awaiting their first token, this request's included (llm-d's token-load)"},
	{Name: v1alpha1.ScorerKVCost, New: func(Profile) Scorer { return KVCost{} }, Prefix: true,
		Description: "lowest prefill blocks still to compute plus active KV blocks (Dynamo's KV-router cost)"},
}

// Scorers returns the registered scorers, in the order the picker runs them.
func Scorers() []ScorerSpec { return slices.Clone(scorers[:]) }

// LookupScorer returns the named scorer's description.
func LookupScorer(name v1alpha1.ScorerName) (ScorerSpec, bool) {
	i := scorerIndex(name)
	if i < 0 {
		return ScorerSpec{}, false
	}
	return scorers[i], true
}

func scorerIndex(name v1alpha1.ScorerName) int {
	for i := range scorers {
		if scorers[i].Name == name {
			return i
		}
	}
	return -1
}

// WeightNames are the scorers a profile's weights can name, in the order the
// picker runs them.
func WeightNames() []v1alpha1.ScorerName {
	out := make([]v1alpha1.ScorerName, len(scorers))
	for i := range scorers {
		out[i] = scorers[i].Name
	}
	return out
}

// FilterName names a filter of the weighted picker.
type FilterName string

// The filters, in the order the picker applies them.
const (
	FilterHealth     FilterName = "health"
	FilterFreshness  FilterName = "freshness"
	FilterSaturation FilterName = "saturation"
	FilterAdapter    FilterName = "adapterCapacity"
	FilterAffinity   FilterName = "prefixAffinity"
)

// FilterSpec describes a filter. Each keeps what it accepts of the endpoints
// the previous one kept, or all of them when it accepts none: the picker
// fails open rather than refusing.
type FilterSpec struct {
	Name        FilterName
	Description string
	keep        func(p *Weighted, req Request, eps []Endpoint) []Endpoint
}

var filters = [...]FilterSpec{
	{Name: FilterHealth, Description: "drops endpoints whose scrapes fail", keep: (*Weighted).healthy},
	{Name: FilterFreshness, Description: "drops endpoints whose metrics are stale", keep: (*Weighted).fresh},
	{Name: FilterSaturation, Description: "drops endpoints at the queue or KV-cache threshold, or failing more than the best",
		keep: (*Weighted).unsaturated},
	{Name: FilterAdapter, Description: "for an adapter's request, drops endpoints that can neither run nor load it",
		keep: (*Weighted).adapterRoom},
	{Name: FilterAffinity, Description: "with the profile's affinity gate, keeps the cache-warm endpoints unless they are loaded past the gate",
		keep: (*Weighted).prefixAffinity},
}

// Filters returns the registered filters, in the order the picker applies
// them.
func Filters() []FilterSpec { return slices.Clone(filters[:]) }

// ProfileSpec describes a built-in profile.
type ProfileSpec struct {
	Name    v1alpha1.ProfileName
	Profile Profile
	// Description says in a line what the profile weighs, for help and
	// reports.
	Description string
}

// GIEDefault are the weights of the Gateway API Inference Extension's default
// profile, which AWS's gateway documents too.
var GIEDefault = Weights{v1alpha1.ScorerQueue: 2, v1alpha1.ScorerKVCache: 2, v1alpha1.ScorerPrefix: 3}

// DefaultProfile is the profile of a scheduler that names none
// (v1alpha1.ProfileKvgate).
const DefaultProfile = v1alpha1.ProfileChat

// profiles are the built-in profiles; docs/benchmarks.md says how the chat and
// batch weights were chosen.
var profiles = [...]ProfileSpec{
	{Name: v1alpha1.ProfileGIEDefault, Profile: Profile{Weights: GIEDefault},
		Description: "kvgate's picker with the Gateway API Inference Extension's default weights (queue 2, kvCache 2, prefix 3)"},
	{Name: v1alpha1.ProfileChat, Profile: Profile{Weights: Weights{v1alpha1.ScorerQueue: 1, v1alpha1.ScorerKVCache: 6, v1alpha1.ScorerPrefix: 4,
		v1alpha1.ScorerPrefillQueue: 2, v1alpha1.ScorerErrorRate: 6, v1alpha1.ScorerPredictedLatency: 6}, QueueSpread: 16},
		Description: "kvgate's chat profile: KV cache, queue and queued prefill tokens, prefix affinity, error rate, predicted latency"},
	{Name: v1alpha1.ProfileBatch, Profile: Profile{Weights: Weights{v1alpha1.ScorerQueue: 1, v1alpha1.ScorerKVCache: 3, v1alpha1.ScorerPrefix: 3,
		v1alpha1.ScorerErrorRate: 4}, QueueSpread: 8},
		Description: "kvgate's batch profile: KV cache, queue and prefix affinity, error rate"},
	{Name: v1alpha1.ProfileLLMDSticky, Profile: Profile{Weights: Weights{v1alpha1.ScorerTokenLoad: 1}, Affinity: LLMDAffinity, SkipSaturation: true},
		Description: "llm-d's default (sticky until saturated): cache-warm endpoints (prefix ≥ 0.8) until their queued prefill " +
			"outlasts the others' by 18 s at 15,928 tokens/s, then fewest uncached prompt tokens in flight"},
	{Name: v1alpha1.ProfileDynamoKV, Profile: Profile{Weights: Weights{v1alpha1.ScorerKVCost: 1}, SkipSaturation: true},
		Description: "Dynamo's KV router (temperature 0): lowest prefill blocks still to compute plus active KV blocks"},
}

// Profiles returns the built-in profiles, ProfileKvgate first as the default's
// alias, then in order of name; each holds its own copy of the weights.
func Profiles() []ProfileSpec {
	def, _ := lookupProfile(DefaultProfile)
	def.Name, def.Description = v1alpha1.ProfileKvgate, fmt.Sprintf("kvgate's default profile (%s)", DefaultProfile)
	out := []ProfileSpec{def}
	for _, p := range slices.SortedFunc(slices.Values(profiles[:]), func(a, b ProfileSpec) int { return cmp.Compare(a.Name, b.Name) }) {
		p.Profile.Weights = maps.Clone(p.Profile.Weights)
		out = append(out, p)
	}
	return out
}

// ProfileNames are the values of a scheduler's profile: ProfileKvgate, then
// the built-in profiles in order of name.
func ProfileNames() []v1alpha1.ProfileName {
	var out []v1alpha1.ProfileName
	for _, p := range Profiles() {
		out = append(out, p.Name)
	}
	return out
}

// LookupProfile returns a copy of the named profile (ProfileKvgate or "" is
// the default profile).
func LookupProfile(name string) (Profile, error) {
	n := v1alpha1.ProfileName(name)
	if n == "" || n == v1alpha1.ProfileKvgate {
		n = DefaultProfile
	}
	p, ok := lookupProfile(n)
	if !ok {
		return Profile{}, fmt.Errorf("unknown profile %q", name)
	}
	return p.Profile, nil
}

// lookupProfile returns the named built-in profile with its own weights.
func lookupProfile(name v1alpha1.ProfileName) (ProfileSpec, bool) {
	for _, p := range profiles {
		if p.Name == name {
			p.Profile.Weights = maps.Clone(p.Profile.Weights)
			return p, true
		}
	}
	return ProfileSpec{}, false
}
