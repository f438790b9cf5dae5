package route

import (
	"context"
	"errors"
	"net/http"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
)

// Config is one applied configuration as a front sees it for one request:
// authentication, body rules and limits, then the pick, all read from the
// same configuration. A front takes one with Router.Current when a request
// arrives and asks it everything else; a reload meanwhile changes nothing
// for that request. The zero Config (before any configuration) refuses.
type Config struct {
	g  *Router
	rt *routes
}

// Current is the configuration serving now, for one request.
func (g *Router) Current() Config { return Config{g: g, rt: g.routes.Load()} }

// Configured says whether there is a configuration at all.
func (c Config) Configured() bool { return c.rt != nil }

// Authenticate checks a request's credentials against spec.auth: its
// identity, nil when the configuration has none (anyone is served), or the
// refusal to answer (401 or 403 with WWW-Authenticate, 429 with Retry-After
// for a client address past its failures; "" for none known), counted.
func (c Config) Authenticate(h http.Header, client string) (*auth.Identity, *proxy.Refusal) {
	if c.rt == nil || c.rt.auth == nil {
		return nil, nil
	}
	id, err := c.rt.auth.a.AuthenticateFrom(h, client)
	if err != nil {
		var ae *auth.Error
		if !errors.As(err, &ae) {
			ae = &auth.Error{Reason: auth.ReasonInvalid} // fail closed
		}
		c.g.CountRefused(ae.StatusCode())
		return nil, &proxy.Refusal{Status: ae.StatusCode(), Type: ae.Type(), Message: ae.Message(), Challenge: ae.Challenge(), RetryAfter: ae.RetryAfterSeconds()}
	}
	return &id, nil
}

// AuthEnabled says whether the configuration authenticates requests: a
// front then strips the credentials before the request goes upstream.
func (c Config) AuthEnabled() bool { return c.rt != nil && c.rt.auth != nil }

// Exposes says whether a request of this identity may read routing
// internals (spec.gateway.diagnostics).
func (c Config) Exposes(id *auth.Identity) bool { return c.rt != nil && exposes(c.rt.gw, id) }

// MaxBody is the request body limit (bbr.maxRequestBodyBytes); 0 before a
// configuration.
func (c Config) MaxBody() int64 {
	if c.rt == nil {
		return 0
	}
	return c.rt.maxBody
}

// PromptLimit is how many bytes of a prompt's head the prefix indexes hash:
// a front need not read further for the pick (0: none does).
func (c Config) PromptLimit() int {
	if c.rt == nil {
		return 0
	}
	return c.rt.promptLimit
}

// MaxBuffered bounds the request bytes held in memory across all requests
// (spec.gateway.maxBufferedBytes); 0 before a configuration.
func (c Config) MaxBuffered() int64 {
	if c.rt == nil {
		return 0
	}
	return c.rt.gw.MaxBuffered()
}

// WantsUser says whether a scheduler takes session keys from the body's user
// field: a front then reads it (Request.User).
func (c Config) WantsUser() bool { return c.rt != nil && c.rt.wantsUser }

// BaseModel returns the base model of a model or adapter name the
// configuration routes (itself for a base model), and whether it routes it.
func (c Config) BaseModel(name string) (string, bool) {
	if c.rt != nil {
		if p := c.rt.byModel[name]; p != nil {
			return p.spec.ModelName, true
		}
	}
	return "", false
}

// OnlyModel is the model of the configuration's only scheduler, for requests
// that name none, when there is exactly one.
func (c Config) OnlyModel() (string, bool) {
	if c.rt != nil && len(c.rt.schedulers) == 1 {
		return c.rt.schedulers[0].spec.ModelName, true
	}
	return "", false
}

// Models lists every model and adapter the configuration routes to a request
// of this identity, in the OpenAI list's terms: a tenant sees only the
// models it may use.
func (c Config) Models(id *auth.Identity) []openai.Model {
	var data []openai.Model
	if c.rt == nil {
		return data
	}
	// A file has no creation time: its models were made when the router
	// first took a configuration.
	created := c.rt.cfg.CreationTimestamp.Unix()
	if c.rt.cfg.CreationTimestamp.IsZero() {
		created = c.g.started.Load()
	}
	for _, p := range c.rt.schedulers {
		if !allowed(p, id) {
			continue
		}
		data = append(data, openai.Model{ID: p.spec.ModelName, Object: "model", Created: created, OwnedBy: "kvgate"})
		for _, a := range p.spec.LoRAAdapters {
			data = append(data, openai.Model{ID: a, Object: "model", Created: created, OwnedBy: "kvgate", Parent: &p.spec.ModelName})
		}
	}
	return data
}

// Route picks an endpoint for a request under this configuration and
// reserves it (Router.Route).
func (c Config) Route(ctx context.Context, req Request) (*Route, *proxy.Refusal) {
	if c.g == nil {
		return nil, proxy.NoConfiguration() // the zero Config: no router to count it
	}
	return c.g.route(ctx, c.rt, req)
}
