package kube

import (
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestLeaseName: every InferenceGatewayConfig name gives a valid Lease name of
// its own, also where a cut at 63 characters ended in '-' or made two configs
// share one.
func TestLeaseName(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, tc := range []struct{ name, config string }{
		{"short", "kvgate"},
		{"a cut at 63 would end in -", strings.Repeat("a", 48) + "-prod"},
		{"253 characters", long + "xyz"},
		{"253 characters, another", long + "xyw"},
		{"dots", "gw.models.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LeaseName(tc.config)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("LeaseName(%q) = %q: %v", tc.config, got, errs)
			}
			if len(tc.config) < 200 && got != "kvgate-status-"+tc.config {
				t.Errorf("LeaseName(%q) = %q, want the name in full", tc.config, got)
			}
		})
	}
	if LeaseName(long+"xyz") == LeaseName(long+"xyw") {
		t.Error("two long names share a Lease")
	}
}

// TestTrim: messages are cut within the limit at a rune boundary, so that the
// API server stores them as written and the next status compares equal.
func TestTrim(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
	}{
		{"short", "fine", 10},
		{"ascii", strings.Repeat("x", 5000), 4096},
		{"two-byte runes", strings.Repeat("é", 3000), 4096},
		{"three-byte runes at the cut", strings.Repeat("€", 2000), 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := trimTo(tc.in, tc.n)
			if len(got) > tc.n || !utf8.ValidString(got) || (len(tc.in) > tc.n) != strings.HasSuffix(got, "...") {
				t.Errorf("trimTo(%d bytes, %d) = %d bytes, valid UTF-8 %v", len(tc.in), tc.n, len(got), utf8.ValidString(got))
			}
		})
	}
}
