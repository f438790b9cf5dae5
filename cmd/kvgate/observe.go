package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/internal/tracing"
)

// observeFlags are the traces and access-log flags of serve, epp and global.
type observeFlags struct {
	tracing   bool
	accessLog string
}

func (o *observeFlags) register(f *pflag.FlagSet, accessLog bool) {
	f.BoolVar(&o.tracing, "tracing", false, "export OpenTelemetry traces over OTLP/HTTP, configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...)")
	if accessLog {
		f.StringVar(&o.accessLog, "access-log", "off", "one line per request on stdout: off, on, or sampled=N for one in N (5xx and broken streams always)")
	}
}

// setup builds the tracer provider and the access log the flags ask for;
// stop flushes the spans still queued (bounded by tracing.ShutdownTimeout).
// OTEL_SDK_DISABLED=true turns tracing off whatever --tracing says.
func (o *observeFlags) setup(ctx context.Context, service, logFormat string, log *slog.Logger) (p *tracing.Provider, al *tracing.AccessLog, stop func(), err error) {
	al, err = tracing.NewAccessLog(newAccessLogger(logFormat), o.accessLog)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err = tracing.New(ctx, tracing.Options{Enabled: o.tracing && os.Getenv("OTEL_SDK_DISABLED") != "true", ServiceName: service})
	if err != nil {
		return nil, nil, nil, err
	}
	if p.Enabled() {
		log.Info("exporting traces over OTLP/HTTP", "service", service)
	}
	return p, al, func() {
		if err := p.Shutdown(ctx); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}, nil
}

// newAccessLogger writes the access log on stdout, apart from the
// diagnostics on stderr.
func newAccessLogger(format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stdout, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stdout, nil))
}
