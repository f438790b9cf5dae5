package auth

import "testing"

func TestLooksLikeJWT(t *testing.T) {
	for _, tt := range []struct {
		s    string
		want bool
	}{
		{"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln", true},
		{"eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.", true}, // alg none: empty signature
		{"a-_b.c.d", true},
		{"sk-proj-abc123", false},
		{"a.b", false},
		{"a.b.c.d", false},
		{".b.c", false},
		{"a..c", false},
		{"a.b+/.c", false}, // standard base64, not base64url
		{"a.b.c=", false},  // padding
		{"", false},
	} {
		if got := looksLikeJWT(tt.s); got != tt.want {
			t.Errorf("looksLikeJWT(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}
