package proxy

import (
	"net"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/auth"
)

// Tier is which of kvgate's tiers passes a request on: what lies upstream
// decides which of the client's headers may follow it.
type Tier uint8

const (
	// Tier1 passes requests to model servers: kvgate serve, and kvgate epp
	// through Envoy. Both strip the same headers.
	Tier1 Tier = 1
	// Tier2 passes requests to tier-1 clusters: kvgate global.
	Tier2 Tier = 2
)

// ModelHeader names the request's model, for a body that names none (or the
// same one); the Endpoint Picker protocol's header, and the one header of it
// tier 2 passes on, since tier 1 routes by it.
const ModelHeader = "X-Gateway-Model-Name"

// ObjectiveHeader names the request's objective (the Gateway API Inference
// Extension's InferenceObjective), whose priority spec.objectives gives.
const ObjectiveHeader = "X-Gateway-Inference-Objective"

// HeaderPolicy says which of a client's request headers never go upstream. It
// is the one place that says so: kvgate serve and kvgate global apply it
// through Forward (Request), kvgate epp by asking Withheld for each header's
// name (Envoy removes them).
type HeaderPolicy struct {
	Tier Tier
	// StripCredentials: the tier authenticated the request, so the client's
	// credentials were meant for it, not for what lies upstream (as with
	// Envoy's jwt_authn).
	StripCredentials bool
}

// Withheld says whether the client's header name (any case) stays here. The
// hop-by-hop headers are not among them: they belong to the connection, and
// whoever holds it drops them (Request; Envoy for kvgate epp). What stays:
//   - X-Kvgate-*: kvgate's own (x-kvgate-explain, the endpoint and scores
//     it reports): a client neither steers the next tier with them nor passes
//     for kvgate to it;
//   - the credentials, with StripCredentials;
//   - in tier 2, every X-Gateway-* header but ModelHeader: the Endpoint
//     Picker protocol is tier 1's business, which tier 2 drives only through
//     the model and the objective it sets itself;
//   - in tier 1, the Endpoint Picker protocol's headers a client could steer
//     with (see tier1Withheld).
func (p HeaderPolicy) Withheld(name string) bool {
	switch {
	case hasPrefixFold(name, "x-kvgate-"):
		return true
	case p.StripCredentials && auth.IsCredential(name):
		return true
	case !hasPrefixFold(name, "x-gateway-"):
		return false
	case p.Tier == Tier2:
		return !strings.EqualFold(name, ModelHeader)
	}
	return tier1Withheld(name)
}

// tier1Withheld says whether an Endpoint Picker protocol header stays in tier 1.
func tier1Withheld(name string) bool {
	switch {
	case hasPrefixFold(name, "x-gateway-destination-endpoint"):
		// The destination (and its -subset, -served companions) is the picker's
		// answer and the data plane's report: a client never picks the pod.
		return true
	case strings.EqualFold(name, ObjectiveHeader):
		// Read here for the request's priority; a picker further on must not
		// take a client's word for it.
		return true
	case strings.EqualFold(name, "x-gateway-inference-fairness-id"):
		// The flow-control queue a picker files the request under: a client
		// naming its own would jump another's queue at a picker further on.
		return true
	case strings.EqualFold(name, "x-gateway-model-name-rewrite"):
		// Tells the data plane to rewrite the body's model: a client's would
		// have the model server run another model than the one routed.
		return true
	}
	return false
}

// Request fills dst with the client's headers src that go upstream: all but
// those Withheld and the hop-by-hop ones (those src's Connection header names
// too); then sets the request id rid and appends the client's address to
// X-Forwarded-For.
func (p HeaderPolicy) Request(dst, src http.Header, remoteAddr, rid string) {
	for k, vs := range src {
		if !p.Withheld(k) {
			dst[k] = vs
		}
	}
	removeHop(dst, src)
	dst.Set("X-Request-Id", rid)
	if ip, _, err := net.SplitHostPort(remoteAddr); err == nil {
		if prior := src.Get("X-Forwarded-For"); prior != "" {
			ip = prior + ", " + ip
		}
		dst.Set("X-Forwarded-For", ip)
	}
}

// hasPrefixFold is strings.HasPrefix without regard to ASCII case, without
// the allocation of lower-casing a canonical header name.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
