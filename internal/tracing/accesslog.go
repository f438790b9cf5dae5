package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// AccessLog writes one line per request, at Info, on a logger of its own so
// that operators can send it elsewhere than the diagnostics. A nil *AccessLog
// logs nothing.
type AccessLog struct {
	log *slog.Logger
	// every logs one request in this many; failures are always logged.
	every uint64
	n     atomic.Uint64
}

// NewAccessLog parses spec: "off" (or ""), "on", or "sampled=N" for one
// request in N. It returns nil for off.
func NewAccessLog(log *slog.Logger, spec string) (*AccessLog, error) {
	every, err := ParseAccessLog(spec)
	if err != nil || every == 0 {
		return nil, err
	}
	return &AccessLog{log: log, every: every}, nil
}

// ParseAccessLog returns how many requests an access-log spec logs one of
// (0: none).
func ParseAccessLog(spec string) (uint64, error) {
	switch spec {
	case "", "off":
		return 0, nil
	case "on":
		return 1, nil
	}
	if v, ok := strings.CutPrefix(spec, "sampled="); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err == nil && n > 0 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("access log %q: want off, on or sampled=N (N ≥ 1)", spec)
}

// Entry is one request's line.
type Entry struct {
	RequestID string
	// Operation is the GenAI operation (Operation(path)).
	Operation string
	Model     string
	Scheduler string
	// Endpoint served the request (tier 2: the member).
	Endpoint string
	Tenant   string
	Status   int
	// Failed: a 5xx, or a stream that broke after its headers went out.
	Failed bool
	// TTFT is the time to the answer's first bytes (0: none came).
	TTFT                      time.Duration
	Duration                  time.Duration
	InputTokens, OutputTokens int64
	Retries                   int
	// TraceID correlates the line with its trace ("" untraced).
	TraceID string
}

// Log writes e's line if it is sampled: failures always are, the rest one in
// every N.
func (a *AccessLog) Log(ctx context.Context, e *Entry) {
	if a == nil {
		return
	}
	if n := a.n.Add(1); !e.Failed && a.every > 1 && n%a.every != 0 {
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String("request_id", e.RequestID))
	if e.Operation != "" {
		attrs = append(attrs, slog.String(string(GenAIOperation), e.Operation))
	}
	attrs = append(attrs,
		slog.String(string(GenAIRequestModel), e.Model),
		slog.String(string(Scheduler), e.Scheduler),
		slog.String(string(Endpoint), e.Endpoint),
		slog.Int(string(HTTPStatus), e.Status))
	if e.TTFT > 0 {
		attrs = append(attrs, slog.Float64(string(GenAITTFT), e.TTFT.Seconds()))
	}
	attrs = append(attrs,
		slog.Float64("duration", e.Duration.Seconds()),
		slog.Int64(string(GenAIInputTokens), e.InputTokens),
		slog.Int64(string(GenAIOutputTokens), e.OutputTokens),
		slog.Int(string(Retries), e.Retries))
	if e.Tenant != "" {
		attrs = append(attrs, slog.String(string(Tenant), e.Tenant))
	}
	if e.Failed {
		attrs = append(attrs, slog.Bool("failed", true))
	}
	if e.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", e.TraceID))
	}
	if a.every > 1 {
		attrs = append(attrs, slog.Uint64("sampled_every", a.every))
	}
	a.log.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
}
