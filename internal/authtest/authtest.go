// Package authtest is an identity provider for tests on loopback: a JWKS
// served over HTTP whose signing key can be rotated, and the tokens it signs.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// Issuer and Audience are the iss and aud of the tokens an Issuer signs
// unless the claims say otherwise.
const (
	Issuer   = "https://idp.test/"
	Audience = "kvgate"
)

// IdP serves a JWKS at URL and signs tokens with its current key (ES256).
type IdP struct {
	URL string

	mu   sync.Mutex
	keys []key // served; the last signs
	n    int
}

type key struct {
	kid  string
	priv *ecdsa.PrivateKey
}

// New starts an identity provider with one key; it stops with the test.
func New(t testing.TB) *IdP {
	t.Helper()
	p := &IdP{}
	p.Rotate(t, false)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.mu.Lock()
		set := jose.JSONWebKeySet{}
		for _, k := range p.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.kid, Algorithm: "ES256", Use: "sig"})
		}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// Rotate adds a new signing key with a new kid; keep false drops the old
// ones from the JWKS, as an issuer retiring a key does.
func (p *IdP) Rotate(t testing.TB, keep bool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	k := key{kid: fmt.Sprintf("key-%d", p.n), priv: priv}
	if !keep {
		p.keys = nil
	}
	p.keys = append(p.keys, k)
}

// Token signs claims over defaults: iss Issuer, aud Audience, sub tenant,
// exp in an hour. A claim set to nil is left out.
func (p *IdP) Token(t testing.TB, tenant string, claims jwt.MapClaims) string {
	t.Helper()
	p.mu.Lock()
	k := p.keys[len(p.keys)-1]
	p.mu.Unlock()
	return Sign(t, k.priv, k.kid, tenant, claims)
}

// Stranger signs a token with a key the IdP never published, under a kid it
// does not know.
func (p *IdP) Stranger(t testing.TB, tenant string) string {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Sign(t, priv, "unknown-kid", tenant, nil)
}

// Sign makes an ES256 token with the defaults of Token.
func Sign(t testing.TB, priv *ecdsa.PrivateKey, kid, tenant string, claims jwt.MapClaims) string {
	t.Helper()
	all := jwt.MapClaims{"iss": Issuer, "aud": Audience, "sub": tenant, "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range claims {
		if v == nil {
			delete(all, k)
			continue
		}
		all[k] = v
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, all)
	tok.Header["kid"] = kid
	s, err := tok.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
