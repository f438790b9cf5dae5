package global

import (
	"context"
	"net/http"

	"github.com/kvgate/kvgate/internal/ratelimit"
)

// sharedLimiter applies the configuration's limits through the shared
// rate limiter: the tenant's limit on the model (or on all its models, "*"),
// and the model's limit across tenants. A request passes only if both do;
// one refused by the second gives back what the first reserved.
type sharedLimiter struct {
	l       *ratelimit.Limiter
	tenants map[string]map[string]ratelimit.Limits // tenant → model or "*" → limits
	models  map[string]ratelimit.Limits
}

func newSharedLimiter(l *ratelimit.Limiter, spec Spec) *sharedLimiter {
	s := &sharedLimiter{l: l, tenants: map[string]map[string]ratelimit.Limits{}, models: map[string]ratelimit.Limits{}}
	for _, t := range spec.Tenants {
		for _, tl := range t.Limits {
			if s.tenants[t.Name] == nil {
				s.tenants[t.Name] = map[string]ratelimit.Limits{}
			}
			s.tenants[t.Name][tl.Model] = ratelimit.Limits{RequestsPerMinute: tl.RequestsPerMinute, TokensPerMinute: tl.TokensPerMinute}
		}
	}
	for _, m := range spec.Models {
		if m.Limits != nil {
			s.models[m.Name] = ratelimit.Limits{RequestsPerMinute: m.Limits.RequestsPerMinute, TokensPerMinute: m.Limits.TokensPerMinute}
		}
	}
	return s
}

type scope struct {
	key    ratelimit.Key
	limits ratelimit.Limits
}

// scopes are the limits that apply to a request.
func (s *sharedLimiter) scopes(tenant, model string) []scope {
	var out []scope
	if tl := s.tenants[tenant]; tl != nil {
		if l, ok := tl[model]; ok {
			out = append(out, scope{ratelimit.Key{Tenant: tenant, Model: model}, l})
		} else if l, ok := tl["*"]; ok {
			out = append(out, scope{ratelimit.Key{Tenant: tenant, Model: "*"}, l})
		}
	}
	if l, ok := s.models[model]; ok {
		out = append(out, scope{ratelimit.Key{Tenant: "*", Model: model}, l})
	}
	return out
}

// Admit implements Limiter.
func (s *sharedLimiter) Admit(ctx context.Context, tenant, model string, tokens int64) (Admission, error) {
	adm := Admission{Allowed: true, Headers: http.Header{}}
	var held []*ratelimit.Reservation
	giveBack := func() {
		for _, r := range held {
			_ = r.Cancel(context.WithoutCancel(ctx))
		}
	}
	for i, sc := range s.scopes(tenant, model) {
		res, rsv, err := s.l.Reserve(ctx, sc.key, sc.limits, tokens)
		if err != nil {
			// Fail-closed with Redis unavailable, or the client gone.
			giveBack()
			return Admission{}, err
		}
		// The client sees its own (the first) scope's headers, or those of the
		// scope that refused it.
		if i == 0 || !res.Allowed {
			adm.Headers = http.Header{}
			ratelimit.SetHeaders(adm.Headers, res)
		}
		if !res.Allowed {
			giveBack()
			return Admission{RetryAfter: res.RetryAfter, TooLarge: res.TooLarge, Headers: adm.Headers}, nil
		}
		if rsv != nil {
			held = append(held, rsv)
		}
	}
	adm.Reconcile = func(ctx context.Context, used int64) {
		for _, r := range held {
			_ = r.Reconcile(ctx, used)
		}
	}
	adm.Cancel = func(ctx context.Context) {
		for _, r := range held {
			_ = r.Cancel(ctx)
		}
	}
	return adm, nil
}
