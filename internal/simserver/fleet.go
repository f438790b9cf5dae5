package simserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sim"
)

// FleetSpec is a fleet file: several simulated servers run by one process.
type FleetSpec struct {
	// Seed is the base seed; server i is seeded Seed+i unless it sets its own.
	Seed uint64 `json:"seed,omitempty"`
	// Admin, when set, is the address of the fleet admin API (/admin/servers).
	Admin   string       `json:"admin,omitempty"`
	Servers []ServerSpec `json:"servers"`
}

// ServerSpec describes one server, or Replicas identical ones on consecutive ports.
type ServerSpec struct {
	Name                string   `json:"name"`
	Listen              string   `json:"listen"`
	Replicas            int      `json:"replicas,omitempty"`
	GPU                 string   `json:"gpu"`
	Model               string   `json:"model"`
	ModelSize           string   `json:"modelSize"`
	TensorParallel      int      `json:"tensorParallel,omitempty"`
	ServedName          string   `json:"servedName,omitempty"`
	LoRAModules         []string `json:"loraModules,omitempty"`
	MaxLoRAs            int      `json:"maxLoras,omitempty"`
	LoRALoadTime        Duration `json:"loraLoadTime,omitempty"`
	Engine              Dialect  `json:"engine,omitempty"`
	LegacyMetricNames   bool     `json:"legacyMetricNames,omitempty"`
	MaxNumSeqs          int      `json:"maxNumSeqs,omitempty"`
	MaxNumBatchedTokens int      `json:"maxNumBatchedTokens,omitempty"`
	MaxModelLen         int      `json:"maxModelLen,omitempty"`
	NumGPUBlocks        int      `json:"numGpuBlocks,omitempty"`
	OutputMedian        int      `json:"outputMedian,omitempty"`
	Seed                *uint64  `json:"seed,omitempty"`
	Faults              Faults   `json:"faults,omitempty"`
}

// LoadFleet reads and checks a fleet file. Unknown fields are errors.
func LoadFleet(path string) (FleetSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return FleetSpec{}, err
	}
	return ParseFleet(data)
}

// ParseFleet decodes a fleet file's contents.
func ParseFleet(data []byte) (FleetSpec, error) {
	var f FleetSpec
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return FleetSpec{}, fmt.Errorf("fleet file: %w", err)
	}
	if len(f.Servers) == 0 {
		return FleetSpec{}, errors.New("fleet file: no servers")
	}
	return f, nil
}

// Options expands the spec into one Options per server, with listen addresses.
func (f FleetSpec) Options(log *slog.Logger) ([]Options, []string, error) {
	var opts []Options
	var addrs []string
	names := map[string]bool{}
	for i, sp := range f.Servers {
		if sp.Name == "" || sp.Listen == "" || sp.GPU == "" || sp.ModelSize == "" || sp.Model == "" {
			return nil, nil, fmt.Errorf("servers[%d]: name, listen, gpu, model and modelSize are required", i)
		}
		n := max(sp.Replicas, 1)
		host, portStr, err := net.SplitHostPort(sp.Listen)
		if err != nil {
			return nil, nil, fmt.Errorf("servers[%d] (%s): listen %q: %w", i, sp.Name, sp.Listen, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || (n > 1 && port == 0) {
			return nil, nil, fmt.Errorf("servers[%d] (%s): listen %q needs a numeric port (non-zero with replicas)", i, sp.Name, sp.Listen)
		}
		for r := range n {
			name := sp.Name
			addr := sp.Listen
			if n > 1 {
				name = fmt.Sprintf("%s-%d", sp.Name, r)
				addr = net.JoinHostPort(host, strconv.Itoa(port+r))
			}
			if names[name] {
				return nil, nil, fmt.Errorf("servers[%d]: duplicate server name %q", i, name)
			}
			names[name] = true
			seed := f.Seed + uint64(len(opts))
			if sp.Seed != nil {
				seed = *sp.Seed + uint64(r)
			}
			opts = append(opts, Options{
				Name: name, Model: sp.Model, ServedName: sp.ServedName, Dialect: sp.Engine,
				LegacyNames: sp.LegacyMetricNames, LoRAModules: sp.LoRAModules, Faults: sp.Faults, Logger: log,
				Engine: sim.Config{
					GPU: sp.GPU, ModelSize: sp.ModelSize, TensorParallel: sp.TensorParallel,
					MaxNumSeqs: sp.MaxNumSeqs, MaxNumBatchedTokens: sp.MaxNumBatchedTokens, MaxModelLen: sp.MaxModelLen,
					NumGPUBlocks: sp.NumGPUBlocks, MaxLoRAs: sp.MaxLoRAs, LoRALoadTime: time.Duration(sp.LoRALoadTime),
					OutputMedian: sp.OutputMedian, Seed: seed,
				},
			})
			addrs = append(addrs, addr)
		}
	}
	return opts, addrs, nil
}

// Fleet is a set of servers run together, with an optional admin API.
type Fleet struct {
	Servers []*Server
	admin   *http.Server
	adminLn net.Listener
}

// NewFleet builds and binds every server of opts at addrs, and the admin API at
// adminAddr when it is not empty. Nothing is served until Serve.
func NewFleet(opts []Options, addrs []string, adminAddr string) (*Fleet, error) {
	f := &Fleet{}
	for i, o := range opts {
		s, err := New(o)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("server %s: %w", o.Name, err)
		}
		if err := s.Listen(addrs[i]); err != nil {
			f.close()
			return nil, err
		}
		f.Servers = append(f.Servers, s)
	}
	if adminAddr != "" {
		ln, err := net.Listen("tcp", adminAddr)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("admin: %w", err)
		}
		f.adminLn = ln
		f.admin = &http.Server{Handler: f.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
	}
	return f, nil
}

func (f *Fleet) close() {
	for _, s := range f.Servers {
		s.mu.Lock()
		if s.ln != nil {
			_ = s.ln.Close()
		}
		s.mu.Unlock()
	}
	if f.adminLn != nil {
		_ = f.adminLn.Close()
	}
}

// AdminAddr is the admin API's address, or "".
func (f *Fleet) AdminAddr() string {
	if f.adminLn == nil {
		return ""
	}
	return f.adminLn.Addr().String()
}

// Serve runs every server until ctx ends.
func (f *Fleet) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range f.Servers {
		wg.Go(func() { _ = s.Serve(ctx) })
	}
	if f.admin != nil {
		go func() { _ = f.admin.Serve(f.adminLn) }()
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = f.admin.Shutdown(shutdown)
	}
	wg.Wait()
	return nil
}

// serverInfo is one row of GET /admin/servers.
type serverInfo struct {
	Name        string `json:"name"`
	Address     string `json:"address"`
	Model       string `json:"model"`
	GPU         string `json:"gpu"`
	ModelSize   string `json:"modelSize"`
	TP          int    `json:"tensorParallel"`
	Engine      string `json:"engine"`
	KVBlocks    int    `json:"kvBlocks"`
	MaxModelLen int    `json:"maxModelLen"`
	Faults      Faults `json:"faults"`
}

// AdminHandler serves GET /admin/servers and GET/PUT /admin/servers/{name}/faults.
func (f *Fleet) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/servers", func(w http.ResponseWriter, _ *http.Request) {
		out := make([]serverInfo, 0, len(f.Servers))
		for _, s := range f.Servers {
			s.mu.Lock()
			cfg, blocks, maxLen := s.eng.Config(), s.eng.NumBlocks(), s.eng.MaxModelLen()
			s.mu.Unlock()
			out = append(out, serverInfo{
				Name: s.Name(), Address: s.Addr(), Model: s.opts.ServedName, GPU: cfg.GPU, ModelSize: cfg.ModelSize,
				TP: cfg.TensorParallel, Engine: string(s.opts.Dialect), KVBlocks: blocks, MaxModelLen: maxLen, Faults: s.Faults(),
			})
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("/admin/servers/{name}/faults", func(w http.ResponseWriter, r *http.Request) {
		for _, s := range f.Servers {
			if s.Name() == r.PathValue("name") {
				serveFaults(w, r, s)
				return
			}
		}
		names := make([]string, len(f.Servers))
		for i, s := range f.Servers {
			names[i] = s.Name()
		}
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, fmt.Sprintf("no server %q (servers: %s)", r.PathValue("name"), strings.Join(names, ", ")))
	})
	return mux
}
