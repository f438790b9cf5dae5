package bench

// PolicyDescriptions and PolicyDraws stand in for the policies branch's own
// (internal/bench/policies.go), which replaces this file when it lands: run.go
// reads both under these names and signatures.

// PolicyDescriptions describes each policy in one line, for the report.
var PolicyDescriptions = map[string]string{
	"round-robin":   "per-request round-robin (ideal L7)",
	"least-request": "fewest requests in flight through the gateway, ties at random",
	"random":        "an endpoint drawn uniformly at random per request",
	"power-of-two":  "the fewer requests in flight of two endpoints drawn at random",
	"gie-default":   "kvgate's picker with the Gateway API Inference Extension's default weights",
	"kvgate":        "kvgate's default profile (chat)",
	"chat":          "kvgate's chat profile",
	"batch":         "kvgate's batch profile",
}

// PolicyDraws is how many runs policy gets when draws are asked for (0: the
// default): several for a randomised policy whose draw is made once per run,
// one for any other. None of today's policies is one.
func PolicyDraws(policy string, draws int) int { return 1 }
