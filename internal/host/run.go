package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/reload"
	"github.com/kvgate/kvgate/internal/serving"
)

// Options configure Run.
type Options struct {
	ConfigPath   string
	Listen       string // the front's listener: the OpenAI API (:8080) or ext_proc (:9002)
	AdminListen  string // metrics, health, debug; default :9090
	DrainTimeout time.Duration
	// PreStop is how long the API listener keeps accepting after a stop
	// signal, with /readyz failing, before the drain (0: none).
	PreStop time.Duration
	// Reload receives a value for every SIGHUP; the file is also watched.
	Reload <-chan os.Signal
	// Ready, when set, is sent the bound addresses once the listeners accept.
	Ready  chan<- Addrs
	Logger *slog.Logger
	Core   CoreOptions
	// Source, when set, replaces the configuration file: it runs until ctx ends,
	// applying configurations to the host as they come (Kubernetes). The
	// core refuses with 503 and /readyz fails until the first one.
	Source func(ctx context.Context, h *Host) error
	// Front builds the data plane served on Listen.
	Front Mount
}

// Addrs are the bound listener addresses; Health is the gRPC health listener of
// a front that has one.
type Addrs struct{ API, Admin, Health string }

// sourceStopTimeout bounds the wait for a configuration source to stop.
const sourceStopTimeout = 10 * time.Second

// Run loads the configuration, serves the front until ctx ends, then drains.
func Run(ctx context.Context, o Options) error {
	if o.Front == nil {
		return errors.New("host: no front to serve")
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	o.Core.Logger = log
	h := New(o.Core)
	defer h.Close()
	if h.adminErr != nil {
		return h.adminErr
	}
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
		if err := h.Apply(cfg); err != nil {
			return err
		}
		h.Metrics().Reloads.WithLabelValues("success").Inc()
		schedulers = len(cfg.Spec.Schedulers)
	}
	apiLn, adminLn, err := serving.Listen(o.Listen, o.AdminListen)
	if err != nil {
		return err
	}
	// The configuration source outlives the stop signal: pods leaving during
	// the drain still leave the pool. It ends once the drain is over, and Run
	// waits (a bounded while) for it to tidy up, e.g. release its Lease.
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	sourceDone := make(chan struct{})
	api, err := o.Front(watchCtx, h)
	if err != nil {
		_ = apiLn.Close()
		_ = adminLn.Close()
		return err
	}
	addrs := Addrs{API: apiLn.Addr().String(), Admin: adminLn.Addr().String()}
	if ha, ok := api.(interface{ HealthAddr() string }); ok {
		addrs.Health = ha.HealthAddr()
	}
	errc := make(chan error, 1)
	if o.Source != nil {
		go func() {
			defer close(sourceDone)
			if err := o.Source(watchCtx, h); err != nil && watchCtx.Err() == nil {
				errc <- fmt.Errorf("configuration source: %w", err)
			}
		}()
		defer func() {
			stopWatch()
			select {
			case <-sourceDone:
			case <-time.After(sourceStopTimeout):
				log.Warn("the configuration source did not stop in time", "timeout", sourceStopTimeout)
			}
		}()
	} else {
		go reload.Watch(watchCtx, o.ConfigPath, initial, o.Reload, log, func(data []byte, err error) { h.reload(o.ConfigPath, data, err, log) })
	}
	log.Info("kvgate serving", "api", addrs.API, "admin", addrs.Admin, "health", addrs.Health, "config", o.ConfigPath, "schedulers", schedulers)
	if o.Ready != nil {
		o.Ready <- addrs
	}
	// Drain: fail readiness, keep accepting for the pre-stop window, stop
	// accepting, let in-flight requests finish, end the rest with an error.
	return serving.Serve(ctx, api, apiLn, &http.Server{Handler: h.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}, adminLn, errc,
		func() { h.core.Drain(); log.Info("draining", "preStop", o.PreStop, "timeout", o.DrainTimeout) }, serving.Drain{PreStop: o.PreStop, Timeout: o.DrainTimeout})
}

// reload applies a configuration file's new contents (or the error reading it).
func (h *Host) reload(path string, data []byte, err error, log *slog.Logger) {
	cfg, perr := config.Parse(path, data)
	if err != nil {
		perr = err
	}
	if perr == nil {
		perr = h.Apply(cfg)
	}
	if perr != nil {
		h.RecordRejected(perr)
		h.Metrics().Reloads.WithLabelValues("failure").Inc()
		log.Error("configuration rejected; the previous one keeps serving", "err", perr)
		return
	}
	h.Metrics().Reloads.WithLabelValues("success").Inc()
	log.Info("configuration reloaded", "schedulers", len(cfg.Spec.Schedulers))
}
