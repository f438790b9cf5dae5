package global

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const head = "apiVersion: gateway.kvgate.io/v1alpha1\nkind: GlobalRouterConfig\nspec:\n"
	const member = "  members:\n  - {name: a, url: 'http://a:8080', adminURL: 'http://a:9090', pricePerMillionTokens: 1}\n"
	for _, tc := range []struct {
		name, doc, want string // want: "" for valid, else a piece of the error, with its line
	}{
		{"minimal", head + member, ""},
		{"the example", "", ""},
		{"unknown field", head + member + "  routng: {}\n", "test.yaml:6: spec.routng: unknown field"},
		{"no members", head + "  members: []\n", "at least one member"},
		{"wrong type", head + member + "  routing: {maxAttempts: three}\n", "test.yaml:6: spec.routing.maxAttempts: must be an integer"},
		{"wrong kind", strings.Replace(head, "GlobalRouterConfig", "Gateway", 1) + member, `test.yaml:2: kind: is "Gateway", want "GlobalRouterConfig"`},
		{"bad URL", head + "  members:\n  - {name: a, url: 'a:8080', adminURL: 'http://a:9090'}\n", "test.yaml:5: spec.members[0].url: want an http(s) URL"},
		{"duplicate member", head + member + "  - {name: a, url: 'http://b:8080', adminURL: 'http://b:9090'}\n", "used twice"},
		{"two prices", head + "  members:\n  - {name: a, url: 'http://a', adminURL: 'http://a', pricePerMillionTokens: 1, pricePerGPUHour: 2, tokensPerGPUHour: 9}\n", "not both"},
		{"GPU-hour price without tokens", head + "  members:\n  - {name: a, url: 'http://a', adminURL: 'http://a', pricePerGPUHour: 2}\n", "tokensPerGPUHour"},
		{"zero heartbeat", head + member + "  routing: {heartbeatInterval: 0s}\n", "test.yaml:6: spec.routing.heartbeatInterval: must be > 0"},
		{"timeout under the interval", head + member + "  routing: {heartbeatInterval: 2s, heartbeatTimeout: 1s}\n", "at least heartbeatInterval"},
		{"timeout under the default interval", head + member + "  routing: {heartbeatTimeout: 100ms}\n", "at least heartbeatInterval"},
		{"negative first-byte timeout", head + member + "  routing: {firstByteTimeout: -1s}\n", "firstByteTimeout: must be ≥ 0"},
		{"first-byte timeout off", head + member + "  routing: {firstByteTimeout: 0s}\n", ""},
		{"objective with a newline", head + member + "  tenants: [{name: acme, objective: \"batch\\n\"}]\n", "spec.tenants[0].objective"},
		{"objective", head + member + "  tenants: [{name: acme, objective: batch}]\n", ""},
		{"tenant named *", head + member + "  tenants: [{name: '*'}]\n", "not \"*\""},
		{"tenant limit without model", head + member + "  tenants: [{name: acme, limits: [{requestsPerMinute: 5}]}]\n", "limits[0].model"},
		{"negative limit", head + member + "  tenants: [{name: acme, limits: [{model: '*', requestsPerMinute: -1}]}]\n", "must be ≥ 0"},
		{"bad fail mode", head + member + "  rateLimit: {redis: 'r:6379', failMode: maybe}\n", "failMode"},
		{"rate limit without redis", head + member + "  rateLimit: {failMode: open}\n", "rateLimit.redis"},
		{"bad key hash", head + member + "  auth: {apiKeys: [{tenant: acme, hash: 'sha256:zz'}]}\n", "test.yaml:6: spec.auth.apiKeys[0].hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.doc == "" {
				_, err = Load("../../deploy/examples/global.yaml")
			} else {
				_, err = Parse("test.yaml", []byte(tc.doc))
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid document refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestPrice: a price per GPU-hour becomes one per million tokens.
func TestPrice(t *testing.T) {
	four, rate := 4.0, 5e6
	if p := (Member{PricePerGPUHour: &four, TokensPerGPUHour: &rate}).Price(); p < 0.8-1e-12 || p > 0.8+1e-12 {
		t.Fatalf("4 an hour at 5M tokens an hour: %v per million, want 0.8", p)
	}
}
