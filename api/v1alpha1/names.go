package v1alpha1

// The names a scheduler's profile and weights take. They are declared here,
// with the fields that carry them, so that validation can check them without
// importing the scheduler; internal/schedule registers its scorers and profiles
// under these names, and its tests hold the two in step.

// ScorerName names a scorer of kvgate's GPU-aware picker: a key of a
// scheduler's weights.
type ScorerName string

// The scorers, in the order the picker runs them.
const (
	ScorerQueue            ScorerName = "queue"
	ScorerKVCache          ScorerName = "kvCache"
	ScorerPrefix           ScorerName = "prefix"
	ScorerLoRAAffinity     ScorerName = "loraAffinity"
	ScorerRunningRequests  ScorerName = "runningRequests"
	ScorerPrefillQueue     ScorerName = "prefillQueue"
	ScorerErrorRate        ScorerName = "errorRate"
	ScorerPredictedLatency ScorerName = "predictedLatency"
	ScorerSessionAffinity  ScorerName = "sessionAffinity"
	ScorerTokenLoad        ScorerName = "tokenLoad"
	ScorerKVCost           ScorerName = "kvCost"
)

// ProfileName names a built-in set of weights (SchedulerSpec.Profile).
type ProfileName string

// The built-in profiles.
const (
	// ProfileKvgate is the profile of a scheduler that names none: another
	// name for the default profile, which may change between releases.
	ProfileKvgate     ProfileName = "kvgate"
	ProfileChat       ProfileName = "chat"
	ProfileBatch      ProfileName = "batch"
	ProfileGIEDefault ProfileName = "gie-default"
	// ProfileLLMDSticky and ProfileDynamoKV reproduce two other routers'
	// defaults, for comparison: llm-d's and Dynamo's.
	ProfileLLMDSticky ProfileName = "llm-d-sticky"
	ProfileDynamoKV   ProfileName = "dynamo-kv"
)
