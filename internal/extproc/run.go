package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
)

// MaxMessageBytes bounds one gRPC message: Envoy's body chunks can be large.
const MaxMessageBytes = 32 << 20

// Health service names, as GIE's picker reports them, so that existing probes
// and Envoy health checks work unchanged.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// Listen starts the ext_proc gRPC server of s and its health server on
// healthListen (default :9003; it stays plaintext: Kubernetes gRPC probes
// cannot speak TLS), with tlsConfig when set. The returned front serves the
// ext_proc listener it is handed and shuts both down; readiness follows s
// until ctx ends.
func Listen(ctx context.Context, s *Server, healthListen string, tlsConfig *tls.Config) (*Front, error) {
	if healthListen == "" {
		healthListen = ":9003"
	}
	return newFrontend(ctx, s, healthListen, tlsConfig)
}

// ServerOptions are the gRPC server's options. Envoy multiplexes every
// request's stream on a few connections and streams whole bodies through them:
// gRPC's default 64 KiB windows would make a 220 KB prompt wait for window
// updates, so the windows are large (what Envoy itself uses by default is
// larger still).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		experimental.BufferPool(BufferPool()),
		grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(4 << 20), grpc.InitialConnWindowSize(64 << 20),
		// Envoy pings idle connections; allow it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
}

// BufferPool is gRPC's buffer pool with tiers for body messages of up to 64 and
// 128 KiB. gRPC's default tiers jump from 32 KiB to 1 MiB, so each body chunk
// of Envoy's or of this server's (up to 62,000 bytes) took and cleared a 1 MiB
// buffer: a fifth of the CPU at 220 KB prompts (BenchmarkOverhead's profile).
func BufferPool() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 17, 20)
	if err != nil {
		panic(err) // the exponents are constants
	}
	return p
}

// Front is the ext_proc gRPC server and its health server, on their own
// listeners as GIE's picker has them.
type Front struct {
	srv, healthSrv *grpc.Server
	health         *health.Server
	healthLn       net.Listener
}

func newFrontend(ctx context.Context, s *Server, healthListen string, tlsConfig *tls.Config) (*Front, error) {
	ln, err := net.Listen("tcp", healthListen)
	if err != nil {
		return nil, errors.Join(errors.New("health listener"), err)
	}
	so := ServerOptions()
	if tlsConfig != nil {
		so = append(so, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	f := &Front{
		srv:       grpc.NewServer(so...),
		healthSrv: grpc.NewServer(),
		health:    health.NewServer(),
		healthLn:  ln,
	}
	extprocv3.RegisterExternalProcessorServer(f.srv, s)
	healthpb.RegisterHealthServer(f.healthSrv, f.health)
	// The picker's service is also reachable for health checks on its own port.
	healthpb.RegisterHealthServer(f.srv, f.health)
	f.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	go func() { _ = f.healthSrv.Serve(ln) }()
	go f.track(ctx, s)
	return f, nil
}

// track keeps the readiness statuses in step with the gateway: a picker is ready
// once it knows endpoints; a body-based router as soon as it serves.
func (f *Front) track(ctx context.Context, s *Server) {
	last := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if s.Ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		if st != last {
			for _, name := range []string{"", HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
				f.health.SetServingStatus(name, st)
			}
			last = st
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// HealthAddr is the health listener's address.
func (f *Front) HealthAddr() string { return f.healthLn.Addr().String() }

func (f *Front) Serve(ln net.Listener) error { return f.srv.Serve(ln) }

// Shutdown reports not serving, lets the streams in flight end, and stops hard
// when ctx ends first.
func (f *Front) Shutdown(ctx context.Context) error {
	f.health.Shutdown()
	done := make(chan struct{})
	go func() {
		f.srv.GracefulStop()
		close(done)
	}()
	defer f.healthSrv.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		f.srv.Stop()
		return ctx.Err()
	}
}
