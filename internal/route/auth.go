package route

import (
	"fmt"
	"reflect"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/proxy"
)

// authState is a configuration's spec.auth, built: the Authenticator and the
// spec it came from, so that a reload that leaves spec.auth alone keeps it
// (and its JWKS) rather than fetching the keys again.
type authState struct {
	spec *v1alpha1.AuthSpec
	a    *auth.Authenticator
}

// buildAuth returns the authenticator spec asks for: the current one when
// spec is unchanged, nil without spec. fresh says it was built here, for the
// caller to close if the configuration is not applied. A new JWT
// authenticator that could not load its keys replaces a working one only at
// startup: on a reload it is an error, and the one serving keeps its keys
// rather than every token failing.
func (g *Router) buildAuth(spec *v1alpha1.AuthSpec) (st *authState, fresh bool, err error) {
	var cur *authState
	if rt := g.routes.Load(); rt != nil {
		cur = rt.auth
	}
	if cur != nil && reflect.DeepEqual(cur.spec, spec) {
		return cur, false, nil
	}
	if spec == nil {
		return nil, false, nil
	}
	a, err := auth.New(g.fleetCtx, spec, auth.Options{Logger: g.log, Registerer: g.m.Registry})
	if err != nil {
		return nil, false, fmt.Errorf("spec.auth: %w", err)
	}
	if rerr := a.Ready(); rerr != nil && cur != nil && cur.a.Ready() == nil {
		a.Close()
		return nil, false, fmt.Errorf("spec.auth.jwt: the new JWKS could not be loaded, the previous configuration keeps serving: %w", rerr)
	}
	return &authState{spec: spec.DeepCopy(), a: a}, true, nil
}

func exposes(gw v1alpha1.GatewaySpec, id *auth.Identity) bool {
	if id == nil {
		return gw.ExposesTo("", false)
	}
	return gw.ExposesTo(id.Tenant, id.Method != auth.MethodAnonymous)
}

// allowed says whether p serves a request of this identity
// (allowedTenants); Validate made sure spec.auth is set when that is.
func allowed(p *scheduler, id *auth.Identity) bool {
	if len(p.spec.AllowedTenants) == 0 {
		return true
	}
	return id != nil && id.Method != auth.MethodAnonymous && p.spec.Serves(id.Tenant)
}

// notAllowed is the refusal of a model the tenant may not use: the one of a
// model the configuration does not route, so that a tenant cannot learn which
// models exist behind allowedTenants (as /v1/models hides them too).
func notAllowed() *proxy.Refusal {
	return proxy.UnknownModel()
}
