package gateway

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/serving"
)

// ServerOptions configure Run.
type ServerOptions struct {
	ConfigPath   string
	Listen       string // OpenAI API, default :8080
	AdminListen  string // metrics, health, debug; default :9090
	DrainTimeout time.Duration
	// Reload receives a value for every SIGHUP; the file is also watched.
	Reload <-chan os.Signal
	// Ready, when set, is closed once both listeners accept connections.
	Ready   chan<- Addrs
	Logger  *slog.Logger
	Gateway Options
	// Source, when set, replaces the configuration file: it runs until ctx ends,
	// applying configurations to the gateway as they come (Kubernetes). The
	// gateway answers 503 and /readyz fails until the first one.
	Source func(ctx context.Context, g *Gateway) error
	// Frontend, when set, builds the data plane served on Listen instead of the
	// OpenAI HTTP API (the Envoy ext_proc server of `kvgate epp`).
	Frontend func(ctx context.Context, g *Gateway) (Frontend, error)
}

// Frontend is a data plane Run serves on its API listener.
type Frontend = serving.Server

// Addrs are the bound listener addresses; Health is the gRPC health listener of
// a frontend that has one.
type Addrs struct{ API, Admin, Health string }

// Run loads the configuration, serves until ctx ends, then drains.
func Run(ctx context.Context, o ServerOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	o.Gateway.Logger = log
	g := New(o.Gateway)
	defer g.Close()
	var initial []byte
	schedulers := 0
	if o.Source == nil {
		var err error
		if initial, err = os.ReadFile(o.ConfigPath); err != nil {
			return err
		}
		cfg, err := config.Parse(o.ConfigPath, initial)
		if err != nil {
			return err
		}
		if err := g.Apply(cfg); err != nil {
			return err
		}
		g.m.Reloads.WithLabelValues("success").Inc()
		schedulers = len(cfg.Spec.Schedulers)
	}
	apiLn, adminLn, err := serving.Listen(o.Listen, o.AdminListen)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var api Frontend = serving.NewAPI(g, log)
	if o.Frontend != nil {
		if api, err = o.Frontend(watchCtx, g); err != nil {
			_ = apiLn.Close()
			_ = adminLn.Close()
			return err
		}
	}
	addrs := Addrs{API: apiLn.Addr().String(), Admin: adminLn.Addr().String()}
	if h, ok := api.(interface{ HealthAddr() string }); ok {
		addrs.Health = h.HealthAddr()
	}
	errc := make(chan error, 1)
	if o.Source != nil {
		go func() {
			if err := o.Source(watchCtx, g); err != nil && watchCtx.Err() == nil {
				errc <- fmt.Errorf("configuration source: %w", err)
			}
		}()
	} else {
		go g.watch(watchCtx, o.ConfigPath, initial, o.Reload, log)
	}
	log.Info("kvgate serving", "api", addrs.API, "admin", addrs.Admin, "health", addrs.Health, "config", o.ConfigPath, "schedulers", schedulers)
	if o.Ready != nil {
		o.Ready <- addrs
	}
	// Drain: fail readiness, stop accepting, let in-flight requests finish.
	return serving.Serve(ctx, api, apiLn, &http.Server{Handler: g.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}, adminLn, errc,
		func() { g.Drain(); log.Info("draining", "timeout", o.DrainTimeout) }, o.DrainTimeout)
}

// watch reloads the configuration on SIGHUP and when its file changes. Kubernetes
// ConfigMaps swap a symlink in the file's folder, so the folder is watched.
func (g *Gateway) watch(ctx context.Context, path string, last []byte, hup <-chan os.Signal, log *slog.Logger) {

	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		log.Warn("cannot watch the configuration file; reload with SIGHUP", "err", err)
	} else {
		defer func() { _ = w.Close() }()
		if err := w.Add(filepath.Dir(path)); err != nil {
			log.Warn("cannot watch the configuration file; reload with SIGHUP", "err", err)
		} else {
			events, watchErrs = w.Events, w.Errors
		}
	}
	// One comparison once the watch is in place catches a change made between the
	// first read and now.
	debounce := time.After(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last = g.reload(path, nil, log)
		case ev := <-events:
			if filepath.Clean(ev.Name) == filepath.Clean(path) || filepath.Base(ev.Name) == "..data" {
				debounce = time.After(100 * time.Millisecond)
			}
		case <-debounce:
			last = g.reload(path, last, log)
		case err := <-watchErrs:
			// Read so that the watcher never blocks; a missed event (an inotify
			// overflow) is made up for by reading the file again.
			log.Warn("watching the configuration file", "err", err)
			debounce = time.After(100 * time.Millisecond)
		}
	}
}

// reload reads the file and applies it if it changed from prev (nil: always).
// It returns the bytes read.
func (g *Gateway) reload(path string, prev []byte, log *slog.Logger) []byte {
	data, err := os.ReadFile(path)
	if err == nil && prev != nil && bytes.Equal(data, prev) {
		return prev
	}
	cfg, perr := config.Parse(path, data)
	if err != nil {
		perr = err
	}
	if perr == nil {
		perr = g.Apply(cfg)
	}
	if perr != nil {
		g.RecordRejected(perr)
		g.m.Reloads.WithLabelValues("failure").Inc()
		log.Error("configuration rejected; the previous one keeps serving", "err", perr)
		return data
	}
	g.m.Reloads.WithLabelValues("success").Inc()
	log.Info("configuration reloaded", "schedulers", len(cfg.Spec.Schedulers))
	return data
}
