package auth

import (
	"context"
	"net/http"
)

// identityKey is the context key of the Identity; unexported so that only
// this package can set it.
type identityKey struct{}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// FromContext returns the Identity the Middleware put in ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// Middleware authenticates every request before next, which finds the
// Identity with FromContext; refused requests get WriteError's 401. Requests
// whose URL path equals one of open (health routes such as /healthz and
// /readyz) skip authentication and carry no Identity. Paths match exactly,
// without prefixes, so that "/healthz/../v1/chat/completions" cannot slip
// through an open prefix to a router that cleans paths later.
func (a *Authenticator) Middleware(next http.Handler, open ...string) http.Handler {
	openPaths := make(map[string]bool, len(open))
	for _, p := range open {
		openPaths[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		id, err := a.Authenticate(r)
		if err != nil {
			// Debug: scanners probing the front door would flood Info;
			// kvgate_auth_requests_total counts the refusals anyway.
			a.log.Debug("request not authenticated", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			WriteError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), id)))
	})
}
