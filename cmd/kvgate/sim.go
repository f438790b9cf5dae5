package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
)

func newSimCmd() *cobra.Command {
	var (
		fleetFile, listen, admin, logLevel string
		cpuProfile                         string
		tlsCert, tlsKey                    string
		spec                               simserver.ServerSpec
		seed                               uint64
		engine                             string
		loraLoad                           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated model servers (vLLM, SGLang, TensorRT-LLM, TGI or llama.cpp look-alikes)",
		Long: `Runs one simulated model server, or a whole fleet from a fleet file, on loopback. Each server
speaks the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, LoRA loading) and exports
its engine's Prometheus metrics; latencies come from a virtual-time engine with continuous batching,
a paged KV cache with prefix caching, and LoRA slots (docs/simulator.md).`,
		Example: `  kvgate sim --listen 127.0.0.1:8001 --model meta-llama/Llama-3.1-8B-Instruct --gpu h100 --model-size 8b
  kvgate sim --fleet deploy/examples/sim-fleet.yaml --admin 127.0.0.1:8000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(logLevel)
			var fs simserver.FleetSpec
			if fleetFile != "" {
				var err error
				if fs, err = simserver.LoadFleet(fleetFile); err != nil {
					return err
				}
			} else {
				spec.Name, spec.Listen, spec.Engine, spec.LoRALoadTime = "sim", listen, simserver.Dialect(engine), simserver.Duration(loraLoad)
				spec.Seed = &seed
				fs = simserver.FleetSpec{Servers: []simserver.ServerSpec{spec}}
			}
			if admin != "" {
				fs.Admin = admin
			}
			opts, addrs, err := fs.Options(log)
			if err != nil {
				return err
			}
			if tlsCert != "" || tlsKey != "" {
				cfg, err := simserver.CertFiles(tlsCert, tlsKey)
				if err != nil {
					return fmt.Errorf("--tls-cert, --tls-key: %w", err)
				}
				for i := range opts {
					opts[i].TLS = cfg
				}
			}
			fleet, err := simserver.NewFleet(opts, addrs, fs.Admin)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, s := range fleet.Servers {
				c := s.Engine()
				fmt.Fprintf(out, "kvgate sim: %s serving on %s://%s (%s x%d, %s, %s metrics)\n", s.Name(), s.Scheme(), s.Addr(), c.GPU, c.TensorParallel, c.ModelSize, dialectOf(s))
			}
			if a := fleet.AdminAddr(); a != "" {
				fmt.Fprintf(out, "kvgate sim: admin API on http://%s/admin/servers\n", a)
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			return fleet.Serve(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&fleetFile, "fleet", "", "fleet file (YAML) describing several servers; the single-server flags are then ignored")
	f.StringVar(&admin, "admin", "", "address of the fleet admin API (GET /admin/servers, PUT /admin/servers/NAME/faults)")
	f.StringVar(&listen, "listen", "127.0.0.1:8001", "address to serve on")
	f.StringVar(&spec.Model, "model", "meta-llama/Llama-3.1-8B-Instruct", "base model name")
	f.StringVar(&spec.ServedName, "served-model-name", "", "name clients use for the base model (default: --model)")
	f.StringVar(&spec.GPU, "gpu", "h100", fmt.Sprintf("GPU profile %v", sim.GPUNames()))
	f.StringVar(&spec.ModelSize, "model-size", "8b", fmt.Sprintf("model size %v", sim.ModelSizes()))
	f.IntVar(&spec.TensorParallel, "tensor-parallel", 1, "GPUs per server (tensor-parallel degree)")
	f.StringSliceVar(&spec.LoRAModules, "lora-modules", nil, "LoRA adapters servable from the start (comma-separated names)")
	f.IntVar(&spec.MaxLoRAs, "max-loras", 0, "adapters resident at once (default 1 when adapters are used)")
	f.DurationVar(&loraLoad, "lora-load-time", sim.DefaultLoRALoadTime, "time to load an adapter into a slot")
	f.StringVar(&engine, "engine", "vllm", "metric dialect: vllm, sglang, trtllm, triton, tgi, llamacpp or custom (names of no known engine, docs/simulator.md)")
	f.BoolVar(&spec.LegacyMetricNames, "legacy-metric-names", false, "vLLM: export gpu_cache_usage_perc instead of kv_cache_usage_perc; llama.cpp: export kv_cache_usage_ratio and kv_cache_tokens, as builds before mid-2025 did")
	f.IntVar(&spec.MaxNumSeqs, "max-num-seqs", 0, "running sequences at most (default: vLLM's for the GPU: 1024 on a GPU of ≥ 70 GiB other than the A100, else 256)")
	f.IntVar(&spec.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "token budget of one engine step (default: vLLM's API server for the GPU: 8192 on a GPU of ≥ 70 GiB other than the A100, else 2048)")
	f.IntVar(&spec.MaxModelLen, "max-model-len", 0, "longest prompt + output (default: the model's, capped by KV capacity)")
	f.IntVar(&spec.NumGPUBlocks, "num-gpu-blocks", 0, "KV cache size in 16-token blocks (default: derived from GPU memory)")
	f.IntVar(&spec.OutputMedian, "output-median", 0, "median output length when neither max_tokens nor ignore_eos decides it (default 200)")
	f.Uint64Var(&seed, "seed", 0, "seed for output lengths, answers and faults")
	f.StringVar(&tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate (with --tls-key; every server of a fleet), reread when it changes")
	f.StringVar(&tlsKey, "tls-key", "", "the PEM private key of --tls-cert")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&cpuProfile, "cpu-profile", "", "write a Go CPU profile to this file until the process stops")
	cmd.AddCommand(newSimCalibrateCmd())
	return cmd
}

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

func dialectOf(s *simserver.Server) string { return string(s.Dialect()) }

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

func newSimCalibrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "calibrate",
		Short: "Compare the simulator with published vLLM figures, and print its profile per GPU and model size",
		Long: "Measures, in virtual time, every published figure the simulator is calibrated against (the\n" +
			"same workload shape, concurrency and lengths as the source), then TTFT of 1k- and 4k-token prompts\n" +
			"at batch 1 and inter-token latency at batch 1 and 64 for every GPU and model size. Output is\n" +
			"Markdown; docs/simulator.md holds a copy.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeCalibration(cmd.OutOrStdout())
		},
	}
}

// writeCalibration prints the calibration and profile tables as Markdown;
// docs/simulator.md carries the same text between its calibrate markers.
func writeCalibration(out io.Writer) error {
	rows, err := sim.CalibrationTable()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "| deployment | figure | published | simulated | deviation | source |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|---|")
	for _, r := range rows {
		dev := fmt.Sprintf("%+.0f%%", r.Deviation*100)
		if r.Excluded != "" {
			dev += " (not held: " + r.Excluded + ")"
		}
		fmt.Fprintf(out, "| %s | %s | %.4g %s | %.4g %s | %s | %s |\n", r.Deployment, r.Figure, r.Published, r.Unit, r.Simulated, r.Unit, dev, r.Source)
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| deployment | TTFT 1k | TTFT 4k | ITL batch 1 | ITL batch 64 | KV blocks |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|")
	for _, d := range sim.ProfileDeployments {
		p, err := sim.Profile(d)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %d |\n", d, msStr(p.TTFT1k), msStr(p.TTFT4k), msStr(p.ITL1), msStr(p.ITL64), p.KVBlocks)
	}
	return nil
}

func msStr(d time.Duration) string { return fmt.Sprintf("%.1f ms", d.Seconds()*1000) }
