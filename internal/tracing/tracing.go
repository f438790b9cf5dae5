// Package tracing wires kvgate's OpenTelemetry traces and its access log: a
// tracer provider exporting over OTLP/HTTP (configured by the standard OTEL_*
// environment variables), the W3C trace-context propagator, the attribute names
// kvgate's spans use, and a per-request access log.
//
// Off (the default) everything here is a no-op: a no-op tracer whose spans do
// not record, and no exporter.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of kvgate's spans.
const ScopeName = "github.com/kvgate/kvgate"

// DefaultServiceName names the service when OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES do not.
const DefaultServiceName = "kvgate"

// ShutdownTimeout bounds the flush of the spans still queued when kvgate stops.
const ShutdownTimeout = 5 * time.Second

// Options configure New.
type Options struct {
	// Enabled exports spans over OTLP/HTTP; false gives a no-op provider.
	Enabled bool
	// ServiceName is service.name unless the environment sets one (default
	// DefaultServiceName): "kvgate-global" tells tier 2 from tier 1.
	ServiceName string
}

// Provider is the tracer and propagator the data planes start spans with.
// The zero value is not usable: take Disabled() or New's.
type Provider struct {
	tp trace.TracerProvider
	// Tracer starts kvgate's spans.
	Tracer trace.Tracer
	// Propagator reads and writes the W3C traceparent and tracestate headers.
	Propagator propagation.TextMapPropagator
	sdk        *sdktrace.TracerProvider // nil when disabled
}

// Disabled is a provider whose spans do nothing and are never exported.
func Disabled() *Provider {
	tp := noop.NewTracerProvider()
	return &Provider{tp: tp, Tracer: tp.Tracer(ScopeName), Propagator: propagation.TraceContext{}}
}

// New returns the provider o asks for. Enabled, the exporter reads
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _HEADERS,
// _TIMEOUT and the like; the sampler OTEL_TRACES_SAMPLER(_ARG) (default: the
// client's decision, else every request); the resource OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. Nothing is sent until a span ends.
func New(ctx context.Context, o Options) (*Provider, error) {
	if !o.Enabled {
		return Disabled(), nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	name := o.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	// The environment's attributes are merged last, so that they win over
	// the default name.
	env, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", name)), env)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{tp: tp, sdk: tp, Tracer: tp.Tracer(ScopeName), Propagator: propagation.TraceContext{}}, nil
}

// Enabled says whether spans may be exported; a nil provider is disabled.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// TracerProvider is the provider itself, for libraries that take one.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Flush exports the spans ended so far.
func (p *Provider) Flush(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes the queued spans, within ShutdownTimeout, and stops the
// exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}
