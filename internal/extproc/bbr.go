package extproc

import (
	"maps"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/kvgate/kvgate/internal/openai"
)

// BBR is the Body-Based Router's knowledge of LoRA adapters beyond the
// configuration's schedulers (which the router consults first): which names are
// adapters of which base model, from several sources (ConfigMaps labelled
// inference.networking.k8s.io/bbr-managed), each replaced whole when it changes.
type BBR struct {
	mu      sync.RWMutex
	sources map[string]map[string]string // source → adapter → base model
	merged  map[string]string
}

// NewBBR returns a router that knows no adapters yet.
func NewBBR() *BBR { return &BBR{sources: map[string]map[string]string{}, merged: map[string]string{}} }

// SetSource replaces what one source says: adapter name → base model name. A
// base model may map to itself. An empty map removes the source.
func (b *BBR) SetSource(name string, adapters map[string]string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(adapters) == 0 {
		delete(b.sources, name)
	} else {
		b.sources[name] = maps.Clone(adapters)
	}
	merged := map[string]string{}
	// Sources in name order so that a conflict resolves the same way every time.
	for _, src := range slices.Sorted(maps.Keys(b.sources)) {
		for a, base := range b.sources[src] {
			if _, ok := merged[a]; !ok {
				merged[a] = base
			}
		}
	}
	b.merged = merged
}

// BaseModel returns the base model of a model or adapter name, and whether the
// name is known.
func (b *BBR) BaseModel(model string) (string, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	base, ok := b.merged[model]
	return base, ok
}

// routeBody answers the request headers of a body-based routing stream: the
// model headers set from the body (the route is matched again on them), then the
// held body released unchanged. A body without a readable model passes through
// untouched, for the route and the model server to judge.
func (x *exchange) routeBody(sc openai.Scanned, err error, r *chunkReader) error {
	var set []*corev3.HeaderValueOption
	result := "model"
	switch {
	case err != nil, sc.ModelFound && !validHeaderValue(sc.Model):
		result = "unreadable"
	case !sc.ModelFound || sc.Model == "":
		result = "no_model"
	default:
		base, known := x.cfg.BaseModel(sc.Model)
		if !known {
			base, known = x.s.opts.BBR.BaseModel(sc.Model)
		}
		if known && base != sc.Model {
			result = "adapter"
		}
		if !known {
			base = "" // set even when unknown, as GIE's router does, so a stale value never survives
		}
		set = append(set, header(ModelHeader, sc.Model), header(BaseModelHeader, base))
	}
	if err := x.bbrAnswer(result, set); err != nil {
		return err
	}
	return x.release(r)
}

// bbrAnswer sends a body-based routing stream's request headers response. The
// model headers are the router's output: without a model in the body, any a
// client sent are removed, so that a route never matches a client's claim.
func (x *exchange) bbrAnswer(result string, set []*corev3.HeaderValueOption) error {
	x.s.m.BBR.WithLabelValues(result).Inc()
	var remove []string
	if len(set) == 0 {
		for _, h := range []string{ModelHeader, BaseModelHeader} {
			if _, ok := x.headers[h]; ok {
				remove = append(remove, h)
			}
		}
	}
	return x.answerHeaders(set, remove, nil)
}

// maxModelName bounds a model name copied into a header.
const maxModelName = 512

// validHeaderValue says whether a model name can go into a header: Envoy
// rejects a mutation with control characters (and fails the request), and a
// long one would break header size limits.
func validHeaderValue(v string) bool {
	if len(v) > maxModelName {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
