// Package simserver puts the virtual-time engine of internal/sim behind the HTTP API
// of a real model server: OpenAI completions and chat (streaming and not), model
// listing, LoRA loading, health and Prometheus metrics in the dialect of vLLM, SGLang,
// TensorRT-LLM or Triton. A driver goroutine steps the engine and sleeps until wall
// time catches up with the engine's virtual time, so clients see the engine's
// latencies in real time.
package simserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/sim"
)

// Options configure one simulated server.
type Options struct {
	Name string // for logs and the fleet admin API
	// Model is the base model's name (a Hugging Face id); ServedName, when set, is the
	// name clients use instead, as vLLM's --served-model-name.
	Model       string
	ServedName  string
	Engine      sim.Config
	Dialect     Dialect
	LegacyNames bool // vLLM: gpu_cache_usage_perc instead of kv_cache_usage_perc; llama.cpp: the KV gauges of builds before mid-2025
	// OmitMetrics are metric families the exporter leaves out, as a server
	// that does not publish them would (a build or fork without a KV gauge).
	OmitMetrics []string
	LoRAModules []string // adapters servable from the start
	// MaxBodyBytes bounds a request body; 0 means 32 MiB.
	MaxBodyBytes int64
	Faults       Faults
	Logger       *slog.Logger
	// TLS, when set, serves HTTPS (HTTP/1.1 and h2 by ALPN) instead of plain
	// HTTP and h2c, as a model server behind appProtocol https; it needs
	// Certificates or GetCertificate (CertFiles builds one from files).
	TLS *tls.Config
}

// Server is one simulated model server.
type Server struct {
	opts    Options
	log     *slog.Logger
	epoch   time.Time
	wake    chan struct{}
	reg     *prometheus.Registry
	metrics *metrics

	mu       sync.Mutex
	eng      *sim.Engine
	streams  map[uint64]*stream
	adapters map[string]string // servable adapter → path
	faults   Faults
	rng      *rand.Rand
	ln       net.Listener // nil while refusing connections
	addr     string
	httpSrv  *http.Server
	conns    map[net.Conn]struct{}
	closed   bool // the driver has stopped: no more requests are taken
	// scrapes counts the /metrics requests served: the load scrapers put on
	// a model server.
	scrapes atomic.Int64
}

// Scrapes is how many times /metrics was read.
func (s *Server) Scrapes() int64 { return s.scrapes.Load() }

// stream is a request's view of its sequence, published by the driver once wall
// time reaches the step that produced each token.
type stream struct {
	seq *sim.Seq
	// visible (tokens the client may see) and done (the sequence ended) are written
	// by the driver under s.mu and read by the request without it.
	visible atomic.Int64
	done    atomic.Bool
	notify  chan struct{}
	lastTok time.Duration // engine time of the last published token, under s.mu
}

// New builds a server; it starts serving with Serve or ListenAndServe.
func New(opts Options) (*Server, error) {
	if opts.Model == "" {
		return nil, errors.New("a model name is required")
	}
	if opts.ServedName == "" {
		opts.ServedName = opts.Model
	}
	if opts.Dialect == "" {
		opts.Dialect = DialectVLLM
	}
	if !slices.Contains(Dialects, opts.Dialect) {
		return nil, fmt.Errorf("unknown engine %q (known: %v)", opts.Dialect, Dialects)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 32 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := opts.Faults.validate(); err != nil {
		return nil, err
	}
	eng, err := sim.New(opts.Engine)
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:     opts,
		log:      opts.Logger.With("server", opts.Name),
		epoch:    time.Now(),
		wake:     make(chan struct{}, 1),
		reg:      prometheus.NewRegistry(),
		eng:      eng,
		streams:  map[uint64]*stream{},
		adapters: map[string]string{},
		conns:    map[net.Conn]struct{}{},
		faults:   opts.Faults,
		rng:      rand.New(rand.NewPCG(opts.Engine.Seed, 0x5eed)),
	}
	for _, a := range opts.LoRAModules {
		s.adapters[a] = "/sim/adapters/" + a
	}
	s.metrics = newMetrics(s)
	s.reg.MustRegister(s.metrics)
	return s, nil
}

// Engine returns the engine configuration in force (defaults applied).
func (s *Server) Engine() sim.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Config()
}

// Name is the server's name.
func (s *Server) Name() string { return s.opts.Name }

// Addr is the address the server listens on, once listening.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// now is the engine time corresponding to the wall clock.
func (s *Server) now() time.Duration { return time.Since(s.epoch) }

// Run steps the engine until ctx ends. It is the only caller of Engine.Step.
func (s *Server) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var emitted []*sim.Seq
	var wake []chan struct{}
	for {
		if ctx.Err() != nil {
			s.abortAll()
			return
		}
		s.mu.Lock()
		if !s.eng.Busy() {
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				s.abortAll()
				return
			}
		}
		res := s.eng.Step()
		emitted = append(emitted[:0], res.Emitted...)
		s.mu.Unlock()

		if wait := time.Until(s.epoch.Add(res.End)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				s.abortAll()
				return
			}
		}
		wake = s.publish(emitted, res.End, wake[:0])
	}
}

// publish makes the tokens of a step that ended at engine time end visible to their
// requests; wake is scratch space, returned for reuse.
func (s *Server) publish(seqs []*sim.Seq, end time.Duration, wake []chan struct{}) []chan struct{} {
	s.mu.Lock()
	for _, q := range seqs {
		st, ok := s.streams[q.ID]
		if !ok {
			continue
		}
		if q.Generated > 1 {
			s.metrics.observeTokenGap(end - st.lastTok)
		}
		st.lastTok = end
		st.visible.Store(int64(q.Generated))
		if q.Finish != "" && !st.done.Load() {
			st.done.Store(true)
			s.metrics.observeFinished(q)
		}
		if q.Generated == 1 {
			s.metrics.observeFirstToken(q)
		}
		wake = append(wake, st.notify)
	}
	s.mu.Unlock()
	for _, c := range wake {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	return wake
}

// errClosed is returned by submit once the server has stopped.
var errClosed = errors.New("the server is shutting down")

// submit queues a request in the engine and wakes the driver.
func (s *Server) submit(req sim.Request) (*stream, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	now := s.now()
	if !s.eng.Busy() {
		s.eng.AdvanceTo(now)
	}
	// While a step is under way the engine's clock is at its end; the request's
	// latencies still count from now.
	q, err := s.eng.SubmitAt(req, now)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	st := &stream{seq: q, notify: make(chan struct{}, 1)}
	s.streams[q.ID] = st
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return st, nil
}

// release forgets a stream; a sequence still in the engine is aborted because its
// client went away.
func (s *Server) release(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.seq.Finish == "" {
		s.eng.Abort(st.seq)
	}
	delete(s.streams, st.seq.ID)
}

// progress returns what the client of st may see now.
func (s *Server) progress(st *stream) (visible int, done bool) {
	// done first: a stream seen done has all its tokens visible.
	done = st.done.Load()
	return int(st.visible.Load()), done
}

func (s *Server) abortAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, st := range s.streams {
		if st.seq.Finish == "" {
			s.eng.Abort(st.seq)
		}
		st.done.Store(true)
		select {
		case st.notify <- struct{}{}:
		default:
		}
	}
}

// Listen binds addr; Serve then serves on it. Refusing connections (a fault) closes
// the listener and binding it again reopens the server on the same address.
func (s *Server) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server %s: %w", s.opts.Name, err)
	}
	s.mu.Lock()
	s.ln = ln
	s.addr = ln.Addr().String()
	// HTTP/1.1 and HTTP/2 without TLS (h2c, prior knowledge) on the same port, as
	// model servers behind a gateway with appProtocol kubernetes.io/h2c are served;
	// with TLS, HTTP/1.1 and h2 as the client's ALPN asks.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.opts.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	s.httpSrv = &http.Server{
		Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ConnState: s.trackConn, Protocols: &protocols,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		// Its own copy: the server adds its ALPN protocols to it, and servers may share one.
		TLSConfig: s.opts.TLS.Clone(),
		// Handshake failures (a client that refused the certificate) are the server's log lines.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Unlock()
	if s.faults.RefuseConnections {
		return s.setRefusing(true, nil)
	}
	return nil
}

// trackConn keeps the open connections, so that refusing connections can drop them.
func (s *Server) trackConn(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// Serve runs the driver and the HTTP server until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	srv, ln := s.httpSrv, s.ln
	s.mu.Unlock()
	if srv == nil {
		return errors.New("Serve called before Listen")
	}
	go s.Run(ctx)
	if ln != nil {
		go s.serveOn(ln)
	}
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}

func (s *Server) serveOn(ln net.Listener) {
	serve := s.httpSrv.Serve
	if s.opts.TLS != nil {
		// The certificate comes from TLSConfig, not from files here.
		serve = func(ln net.Listener) error { return s.httpSrv.ServeTLS(ln, "", "") }
	}
	if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		s.log.Error("serve", "err", err)
	}
}

// connKey finds a request's connection in its context.
type connKey struct{}

// setRefusing closes or reopens the listener for the refuse-connections fault.
// Open connections are closed too, except spare, the one asking for it, which
// closes after its response.
func (s *Server) setRefusing(refuse bool, spare net.Conn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case refuse && s.ln != nil:
		err := s.ln.Close()
		s.ln = nil
		for c := range s.conns {
			if c != spare {
				_ = c.Close()
			}
		}
		return err
	case !refuse && s.ln == nil && s.addr != "":
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("reopen %s: %w", s.addr, err)
		}
		s.ln = ln
		go s.serveOn(ln)
	}
	return nil
}

// loraEnabled says whether the server was started with LoRA support, which is when
// vLLM exports lora_requests_info.
func (s *Server) loraEnabled() bool {
	return len(s.opts.LoRAModules) > 0 || s.opts.Engine.MaxLoRAs > 0
}

// Dialect is the metric dialect the server exports.
func (s *Server) Dialect() Dialect { return s.opts.Dialect }

// Waiting is the engine's queue length now.
func (s *Server) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Snapshot().Waiting
}

// InSystem is how many requests the engine holds now, queued or running.
func (s *Server) InSystem() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.eng.Snapshot()
	return snap.Waiting + snap.Running
}
