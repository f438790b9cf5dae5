package kube

import (
	"log/slog"

	"github.com/go-logr/logr"
)

// logr adapts the gateway's slog logger for controller-runtime.
func toLogr(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }
