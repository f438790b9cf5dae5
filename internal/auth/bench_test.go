package auth_test

import (
	"fmt"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
)

func BenchmarkAuthenticate(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("api_key/keys=%d", n), func(b *testing.B) {
			cfg := &v1alpha1.AuthSpec{}
			for i := range n {
				cfg.APIKeys = append(cfg.APIKeys, v1alpha1.APIKeySpec{Tenant: fmt.Sprint("t", i), Hash: auth.HashKey(fmt.Sprint("sk-", i))})
			}
			a, _ := newAuth(b, cfg, nil)
			r := request("Authorization", fmt.Sprint("Bearer sk-", n/2))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Authenticate(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	a, _ := newAuth(b, &v1alpha1.AuthSpec{JWT: jwtConfig(standardJWKS(b))}, newClock())
	for _, tc := range []struct {
		name   string
		method jwt.SigningMethod
		key    any
		kid    string
	}{
		{"jwt/RS256", jwt.SigningMethodRS256, rsaKey1(), "rsa-1"},
		{"jwt/ES256", jwt.SigningMethodES256, ecKey(), "ec-1"},
		{"jwt/EdDSA", jwt.SigningMethodEdDSA, edKey(), "ed-1"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := request(bearer(sign(b, tc.method, tc.key, tc.kid, goodClaims("acme")))...)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Authenticate(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
