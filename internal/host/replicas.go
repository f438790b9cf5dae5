package host

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/internal/openai"
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

// Apply installs a configuration in the core (route.Router.Apply) and, on the first one
// that names a shared state (or with the flag's), links this replica to its
// peers. The link is read at start: a later change is logged, not applied.
// Where spec.tls is served, its certificate files are read first: files
// that do not load refuse the whole configuration.
func (h *Host) Apply(cfg *v1alpha1.InferenceGatewayConfig) error {
	commitTLS, err := h.prepareTLS(cfg)
	if err != nil {
		return err
	}
	if err := h.core.Apply(cfg); err != nil {
		return err
	}
	commitTLS()
	h.linkPeers(cfg)
	return nil
}

// linkPeers starts the mesh for the first configuration with a shared state.
func (h *Host) linkPeers(cfg *v1alpha1.InferenceGatewayConfig) {
	spec := cfg.Spec.Gateway.SharedState
	o := h.opts.SharedState
	h.meshMu.Lock()
	defer h.meshMu.Unlock()
	if h.mesh != nil {
		if !reflect.DeepEqual(spec, h.meshSpec) && o.Redis == "" {
			h.log.Warn("spec.gateway.sharedState changed; it applies when the gateway restarts")
			h.meshSpec = spec
		}
		return
	}
	if o.Redis == "" && spec == nil {
		return
	}
	pc, err := peersConfig(cfg, spec, o)
	if err != nil {
		// Tried again with the next configuration; meanwhile it shows.
		peers.Down(h.core.Metrics().Registry)
		h.log.Error("shared state not started; routing on this replica's own state", "err", err)
		return
	}
	redisLogs.Do(func() { redis.SetLogger(redisLogger{h.log}) })
	pc.Logger, pc.Registerer = h.log, h.core.Metrics().Registry
	h.mesh, h.meshSpec = peers.New(pc, h.core), spec
	h.core.SetPeers(h.mesh)
	h.mesh.Start(context.Background())
	h.log.Info("sharing routing state", "redis", pc.Addr, "cluster", pc.Cluster, "replica", h.mesh.Replica())
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
func (h *Host) Close() {
	h.meshMu.Lock()
	m := h.mesh
	h.meshMu.Unlock()
	if m != nil {
		h.core.SetPeers(nil)
		m.Close()
	}
	h.core.Close()
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
func (h *Host) Replicas() ReplicasView {
	h.meshMu.Lock()
	m := h.mesh
	h.meshMu.Unlock()
	v := ReplicasView{InFlightPart: h.core.InFlightPart()}
	v.Rank, v.Replicas = h.core.Share()
	if m != nil {
		mv := m.View()
		v.Shared, v.Mesh = true, &mv
	}
	return v
}

func (h *Host) serveDebugReplicas(w http.ResponseWriter, _ *http.Request) {
	openai.WriteJSON(w, h.Replicas())
}
