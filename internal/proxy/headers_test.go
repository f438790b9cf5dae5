package proxy

import (
	"fmt"
	"net/http"
	"testing"
)

func TestHeaderPolicyWithheld(t *testing.T) {
	// Which client headers stay in each tier, with authentication off and on.
	type want struct{ t1, t1Auth, t2, t2Auth bool }
	for _, c := range []struct {
		name string
		want want
	}{
		{"Content-Type", want{}},
		{"X-Custom", want{}},
		{"X-Request-Id", want{}},
		{"X-Forwarded-For", want{}},
		// Hop-by-hop headers are the connection's holder's to drop (Request's,
		// or Envoy's), not Withheld's.
		{"Connection", want{}},
		{"Upgrade", want{}},
		{"Proxy-Authorization", want{}},
		{"X-Kvgate-Explain", want{true, true, true, true}},
		{"x-kvgate-endpoint", want{true, true, true, true}},
		{"Authorization", want{false, true, false, true}},
		{"api-key", want{false, true, false, true}},
		{"X-Gateway-Destination-Endpoint", want{true, true, true, true}},
		{"x-gateway-destination-endpoint-subset", want{true, true, true, true}},
		{"X-Gateway-Destination-Endpoint-Served", want{true, true, true, true}},
		{"X-Gateway-Inference-Objective", want{true, true, true, true}},
		{"x-gateway-inference-fairness-id", want{true, true, true, true}},
		{"X-Gateway-Model-Name-Rewrite", want{true, true, true, true}},
		{"X-Gateway-Model-Name", want{}},
		{"x-gateway-model-name", want{}},
		// Tier 1 passes the protocol's other headers on; tier 2 none of them.
		{"X-Gateway-Base-Model-Name", want{false, false, true, true}},
		{"X-Gateway-Something-New", want{false, false, true, true}},
		{"X-Gateway", want{}},
		{"X-Kvgate", want{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range []struct {
				policy HeaderPolicy
				want   bool
			}{
				{HeaderPolicy{Tier: Tier1}, c.want.t1},
				{HeaderPolicy{Tier: Tier1, StripCredentials: true}, c.want.t1Auth},
				{HeaderPolicy{Tier: Tier2}, c.want.t2},
				{HeaderPolicy{Tier: Tier2, StripCredentials: true}, c.want.t2Auth},
			} {
				if got := p.policy.Withheld(c.name); got != p.want {
					t.Errorf("%+v.Withheld(%q) = %v, want %v", p.policy, c.name, got, p.want)
				}
			}
		})
	}
}

func TestHeaderPolicyRequest(t *testing.T) {
	src := http.Header{
		"Content-Type":                   {"application/json"},
		"Connection":                     {"keep-alive, X-Secret"},
		"X-Secret":                       {"s"},
		"Keep-Alive":                     {"timeout=5"},
		"Te":                             {"trailers"},
		"Trailer":                        {"X-T"},
		"Transfer-Encoding":              {"chunked"},
		"Upgrade":                        {"h2c"},
		"Proxy-Authorization":            {"Basic x"},
		"Proxy-Connection":               {"keep-alive"},
		"Authorization":                  {"Bearer sk"},
		"X-Kvgate-Explain":               {"1"},
		"X-Gateway-Destination-Endpoint": {"10.0.0.9:8000"},
		"X-Gateway-Model-Name":           {"m"},
		"X-Request-Id":                   {"client-id"},
		"X-Forwarded-For":                {"10.0.0.1"},
	}
	for _, c := range []struct {
		name   string
		policy HeaderPolicy
		remote string
		want   http.Header
	}{
		{"tier 1", HeaderPolicy{Tier: Tier1}, "192.0.2.7:5555", http.Header{
			"Content-Type": {"application/json"}, "Authorization": {"Bearer sk"}, "X-Gateway-Model-Name": {"m"},
			"X-Request-Id": {"rid-1"}, "X-Forwarded-For": {"10.0.0.1, 192.0.2.7"}}},
		{"tier 2 with auth", HeaderPolicy{Tier: Tier2, StripCredentials: true}, "192.0.2.7:5555", http.Header{
			"Content-Type": {"application/json"}, "X-Gateway-Model-Name": {"m"},
			"X-Request-Id": {"rid-1"}, "X-Forwarded-For": {"10.0.0.1, 192.0.2.7"}}},
		{"no client address", HeaderPolicy{Tier: Tier1, StripCredentials: true}, "", http.Header{
			"Content-Type": {"application/json"}, "X-Gateway-Model-Name": {"m"},
			"X-Request-Id": {"rid-1"}, "X-Forwarded-For": {"10.0.0.1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := http.Header{}
			c.policy.Request(dst, src, c.remote, "rid-1")
			if fmt.Sprint(dst) != fmt.Sprint(c.want) {
				t.Errorf("upstream headers\n got %v\nwant %v", dst, c.want)
			}
		})
	}
}

func BenchmarkHeaderPolicyRequest(b *testing.B) {
	src := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer sk"}, "User-Agent": {"OpenAI/Python"},
		"Accept": {"application/json"}, "X-Stainless-Lang": {"python"}, "Content-Length": {"512"}}
	p := HeaderPolicy{Tier: Tier1, StripCredentials: true}
	b.ReportAllocs()
	for b.Loop() {
		p.Request(make(http.Header, len(src)+2), src, "192.0.2.7:5555", "rid")
	}
}
