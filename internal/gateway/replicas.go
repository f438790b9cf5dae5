package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/peers"
)

// SharedStateOptions are the flags' say on shared state; a Redis set here
// overrides the configuration's spec.gateway.sharedState.
type SharedStateOptions struct {
	Redis   string
	Cluster string
	// Replica names this replica (default: the host name with a random
	// suffix; in Kubernetes the pod's name).
	Replica string
	// Heartbeat overrides the peers' heartbeat (tests).
	Heartbeat time.Duration
}

// Validate checks the flags' values.
func (o SharedStateOptions) Validate() error {
	if o.Redis != "" {
		if _, _, err := net.SplitHostPort(o.Redis); err != nil {
			return fmt.Errorf("--shared-state-redis %q: want host:port: %w", o.Redis, err)
		}
	}
	if len(o.Cluster) > 128 {
		return errors.New("--shared-state-cluster: at most 128 characters")
	}
	if len(o.Replica) > 253 {
		return errors.New("--replica-name: at most 253 characters")
	}
	return nil
}

// Environment variables with the shared-state Redis's ACL credentials.
const (
	EnvSharedStateUsername = "KVGATE_SHARED_STATE_USERNAME"
	EnvSharedStatePassword = "KVGATE_SHARED_STATE_PASSWORD"
)

// Apply installs a configuration (route.Router.Apply) and, on the first one
// that names a shared state (or with the flag's), links this replica to its
// peers. The link is read at start: a later change is logged, not applied.
// Where spec.tls is served, its certificate files are read first: files
// that do not load refuse the whole configuration.
func (g *Gateway) Apply(cfg *v1alpha1.InferenceGatewayConfig) error {
	commitTLS, err := g.prepareTLS(cfg)
	if err != nil {
		return err
	}
	if err := g.Router.Apply(cfg); err != nil {
		return err
	}
	commitTLS()
	g.linkPeers(cfg)
	return nil
}

// linkPeers starts the mesh for the first configuration with a shared state.
func (g *Gateway) linkPeers(cfg *v1alpha1.InferenceGatewayConfig) {
	spec := cfg.Spec.Gateway.SharedState
	o := g.opts.SharedState
	g.meshMu.Lock()
	defer g.meshMu.Unlock()
	if g.mesh != nil {
		if !reflect.DeepEqual(spec, g.meshSpec) && o.Redis == "" {
			g.log.Warn("spec.gateway.sharedState changed; it applies when the gateway restarts")
			g.meshSpec = spec
		}
		return
	}
	if o.Redis == "" && spec == nil {
		return
	}
	pc, err := peersConfig(cfg, spec, o)
	if err != nil {
		// Tried again with the next configuration; meanwhile it shows.
		peers.Down(g.Metrics().Registry)
		g.log.Error("shared state not started; routing on this replica's own state", "err", err)
		return
	}
	redisLogs.Do(func() { redis.SetLogger(redisLogger{g.log}) })
	pc.Logger, pc.Registerer = g.log, g.Metrics().Registry
	g.mesh, g.meshSpec = peers.New(pc, g.Router), spec
	g.SetPeers(g.mesh)
	g.mesh.Start(context.Background())
	g.log.Info("sharing routing state", "redis", pc.Addr, "cluster", pc.Cluster, "replica", g.mesh.Replica())
}

// redisLogs routes go-redis's own complaints (a failed dial, a pool
// retry) to the gateway's log, once per process: go-redis has one logger
// for all its clients.
var redisLogs sync.Once

// redisLogger is go-redis's logger as slog, at debug level: the mesh reports
// Redis failing itself, at most every 30 s.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// peersConfig is the mesh's configuration: the flags over the spec.
func peersConfig(cfg *v1alpha1.InferenceGatewayConfig, spec *v1alpha1.SharedStateSpec, o SharedStateOptions) (peers.Config, error) {
	pc := peers.Config{Addr: o.Redis, Cluster: o.Cluster, Replica: o.Replica, Heartbeat: o.Heartbeat,
		Username: os.Getenv(EnvSharedStateUsername), Password: os.Getenv(EnvSharedStatePassword)}
	if spec != nil {
		if pc.Addr == "" {
			pc.Addr = spec.Redis
		}
		if pc.Cluster == "" {
			pc.Cluster = spec.Cluster
		}
		if spec.DB != nil {
			pc.DB = int(*spec.DB)
		}
		if t := spec.TLS; t != nil {
			tc, err := redisTLS(pc.Addr, t)
			if err != nil {
				return pc, err
			}
			pc.TLS = tc
		}
	}
	if pc.Cluster == "" {
		pc.Cluster = cfg.Name
		if cfg.Namespace != "" {
			pc.Cluster = cfg.Namespace + "/" + cfg.Name
		}
	}
	if pc.Replica == "" {
		pc.Replica = os.Getenv("POD_NAME") // the chart sets it; else peers picks one
	}
	return pc, nil
}

func redisTLS(addr string, t *v1alpha1.SharedStateTLS) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if tc.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("spec.gateway.sharedState.redis %q: %w", addr, err)
		}
		tc.ServerName = host
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("spec.gateway.sharedState.tls.caFile: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("spec.gateway.sharedState.tls.caFile %s: no PEM certificate", t.CAFile)
		}
	}
	return tc, nil
}

// Close unlinks the replica from its peers and stops the routing core.
func (g *Gateway) Close() {
	g.meshMu.Lock()
	m := g.mesh
	g.meshMu.Unlock()
	if m != nil {
		g.SetPeers(nil)
		m.Close()
	}
	g.Router.Close()
}

// ReplicasView is /debug/replicas: this replica's place among its peers.
type ReplicasView struct {
	Shared bool `json:"shared"`
	Rank   int  `json:"rank"`
	// Replicas counts the live replicas, this one included.
	Replicas int `json:"replicas"`
	// InFlightPart is this replica's part of maxInFlightPerEndpoint, which it
	// may always use; past it, it borrows what its peers leave free.
	InFlightPart int         `json:"inFlightPart,omitempty"`
	Mesh         *peers.View `json:"mesh,omitempty"`
}

// Replicas reports the replica's peers.
func (g *Gateway) Replicas() ReplicasView {
	g.meshMu.Lock()
	m := g.mesh
	g.meshMu.Unlock()
	v := ReplicasView{InFlightPart: g.InFlightPart()}
	v.Rank, v.Replicas = g.Share()
	if m != nil {
		mv := m.View()
		v.Shared, v.Mesh = true, &mv
	}
	return v
}

func (g *Gateway) serveDebugReplicas(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, g.Replicas())
}
