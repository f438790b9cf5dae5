// Package demo runs kvgate's end-to-end demonstration on an embedded default: a
// simulated fleet on loopback and real streaming traffic against it, with a report
// of what happened.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	gw "github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Options tune the demo.
type Options struct {
	LoadDuration time.Duration // length of the load phase; 0 means 15 s
	Rate         float64       // mean requests per second in the load phase; 0 means 6
	Seed         uint64
	// Out, when set, receives results.json, report.md and plots of the load phase.
	Out string
}

const model = "meta-llama/Llama-3.1-8B-Instruct"

// Run starts the fleet, drives it and writes the report to out.
func Run(ctx context.Context, out io.Writer, opts Options) error {
	if opts.LoadDuration == 0 {
		opts.LoadDuration = 15 * time.Second
	}
	if opts.Rate == 0 {
		opts.Rate = 6
	}
	// The fleet lives as long as the demo: cancelling stops its servers.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fleet, stopped, err := startFleet(ctx)
	if err != nil {
		return err
	}
	defer func() { cancel(); <-stopped }()
	fmt.Fprintln(out, "kvgate demo: a simulated fleet on loopback, driven by real streaming HTTP traffic")
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  server\taddress\tGPU\tmodel\tKV cache")
	for _, s := range fleet {
		c := s.Engine()
		fmt.Fprintf(w, "  %s\thttp://%s\t%s\t%s\t%d blocks\n", s.Name(), s.Addr(), c.GPU, c.ModelSize, kvBlocks(c))
	}
	_ = w.Flush()

	fmt.Fprintln(out, "\n1. One request to each server (~2,000-token prompt, 64 tokens out, streaming):")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  server\tTTFT\tinter-token\ttotal")
	for i, s := range fleet {
		r, err := stream(ctx, "http://"+s.Addr(), model, longPrompt(i, 2000), 64)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", s.Name(), ms(r.ttft), ms(r.itl), ms(r.total))
	}
	_ = w.Flush()

	fmt.Fprintln(out, "\n2. The same ~6,000-token prompt twice on h100-0 (automatic prefix caching):")
	doc := longPrompt(99, 6000)
	cold, err := stream(ctx, "http://"+fleet[0].Addr(), model, doc, 8)
	if err != nil {
		return err
	}
	warm, err := stream(ctx, "http://"+fleet[0].Addr(), model, doc, 8)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   first: TTFT %s, %d cached tokens;  again: TTFT %s, %d cached tokens\n",
		ms(cold.ttft), cold.cached, ms(warm.ttft), warm.cached)

	fmt.Fprintln(out, "\n3. A LoRA adapter on h100-1 (loaded into a GPU slot on first use):")
	first, err := stream(ctx, "http://"+fleet[1].Addr(), "sql-expert", longPrompt(7, 200), 8)
	if err != nil {
		return err
	}
	again, err := stream(ctx, "http://"+fleet[1].Addr(), "sql-expert", longPrompt(8, 200), 8)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   first request TTFT %s (includes the adapter load), next %s\n", ms(first.ttft), ms(again.ttft))

	gw, err := startGateway(ctx, fleet)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n4. Through kvgate serve (http://%s), the same bursty chat traffic twice: %.0f req/s on\n", gw.addr, opts.Rate)
	fmt.Fprintf(out, "   average for %s, in bursts at 5x the quiet rate; first with the round-robin picker (what a\n", opts.LoadDuration)
	fmt.Fprintln(out, "   plain load balancer does), then, after a hot reload of the configuration, with kvgate's")
	fmt.Fprintln(out, "   GPU-aware picker (scraped queue and KV cache, its own dispatches counted between scrapes):")
	gpuOf := map[string]string{}
	for _, s := range fleet {
		gpuOf[s.Addr()] = s.Engine().GPU
	}
	trace, err := workload.Generate(workload.Spec{Kind: workload.Bursty, Seed: opts.Seed + 1, Rate: opts.Rate,
		Requests: max(1, int(opts.Rate*opts.LoadDuration.Seconds())), BurstFactor: 5, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second,
		PromptTokens: workload.Dist{Mean: 1500, Sigma: 0.5, Min: 500, Max: 4000}, OutputTokens: workload.Dist{Mean: 200, Sigma: 0.5, Min: 50, Max: 400}})
	if err != nil {
		return err
	}
	var results []report.Result
	for _, picker := range []string{"round-robin", "kvgate"} {
		if err := gw.use(picker); err != nil {
			return err
		}
		res, recs, err := load(ctx, "http://"+gw.addr, gpuOf, fleet, trace)
		if err != nil {
			return err
		}
		results = append(results, report.Summarize("demo", picker, "live", recs))
		fmt.Fprintf(out, "\n   picker %s:\n", picker)
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "     GPU\tserved\tTTFT p50\tTTFT p95\tpeak queue")
		for _, gpu := range []string{"h100", "a10g"} {
			r := res[gpu]
			fmt.Fprintf(w, "     %s\t%d\t%s\t%s\t%d\n", gpu, len(r.ttfts), ms(pct(r.ttfts, 50)), ms(pct(r.ttfts, 95)), r.peakQueue)
		}
		all := append(slices.Clone(res["h100"].ttfts), res["a10g"].ttfts...)
		fmt.Fprintf(w, "     all\t%d\t%s\t%s\t\n", len(all), ms(pct(all, 50)), ms(pct(all, 95)))
		_ = w.Flush()
	}
	fmt.Fprintln(out, "\n   Round-robin sends the A10G pods as much as the H100s and their queues grow; kvgate reads")
	fmt.Fprintln(out, "   every pod's queue and KV cache and sends the work where it will start soonest.")
	fmt.Fprintln(out)
	sc := []report.Scenario{{Name: "demo", Baseline: "round-robin",
		Description: "2 H100 and 2 A10G simulated servers of Llama-3.1-8B behind kvgate serve; bursty streaming chat traffic (" + workload.Describe(workload.Spec{Kind: workload.Bursty, Rate: opts.Rate, Requests: len(trace), BurstFactor: 5, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second}) + "), sent open loop, the same trace through each picker."}}
	report.Summary(out, sc, results)
	if opts.Out != "" {
		if err := report.Write(opts.Out, sc, results, "Command: `kvgate demo`."); err != nil {
			return err
		}
		fmt.Fprintf(out, "\nreport: %s   plots: %s\n", filepath.Join(opts.Out, "report.md"), filepath.Join(opts.Out, "plots"))
	}
	fmt.Fprintln(out, "\nThe whole comparison in virtual time, against more policies and scenarios: kvgate bench --suite aws")
	return nil
}

func kvBlocks(c sim.Config) int {
	e, err := sim.New(c)
	if err != nil {
		return 0
	}
	return e.NumBlocks()
}

// startFleet runs the example fleet (2 H100, 2 A10G) on free loopback ports until
// ctx ends; stopped closes once every server has stopped.
func startFleet(ctx context.Context) (servers []*simserver.Server, stopped <-chan struct{}, err error) {
	log := slog.New(slog.DiscardHandler)
	var opts []simserver.Options
	for i, gpu := range []string{"h100", "h100", "a10g", "a10g"} {
		o := simserver.Options{
			Name: fmt.Sprintf("%s-%d", gpu, i%2), Model: model, Logger: log,
			Engine: sim.Config{GPU: gpu, ModelSize: "8b", Seed: uint64(i + 1)},
		}
		if gpu == "h100" {
			o.LoRAModules, o.Engine.MaxLoRAs = []string{"sql-expert", "support-bot"}, 2
		} else {
			o.Engine.MaxModelLen = 16384
		}
		opts = append(opts, o)
	}
	addrs := []string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"}
	fleet, err := simserver.NewFleet(opts, addrs, "")
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { _ = fleet.Serve(ctx); close(done) }()
	return fleet.Servers, done, nil
}

// longPrompt builds an English-looking prompt of about n tokens, distinct per seed.
func longPrompt(seed, n int) string {
	rng := rand.New(rand.NewPCG(uint64(seed), 17))
	// Words of at most five letters: each is one token with its space, so n words
	// make about n tokens.
	vocab := strings.Fields("the model serves users while its cache keeps every block and each step " +
		"takes new work so no GPU waits idle for long")
	var b strings.Builder
	fmt.Fprintf(&b, "Document %d. ", seed)
	for range n {
		b.WriteString(vocab[rng.IntN(len(vocab))])
		b.WriteByte(' ')
	}
	return b.String()
}

type result struct {
	start            time.Time // when the request was sent
	ttft, itl, total time.Duration
	cached           int
	endpoint         string // x-kvgate-endpoint, when through the gateway
}

// stream sends one streaming chat request to base (http://host:port) and measures
// it from the client side.
func stream(ctx context.Context, base, model, prompt string, maxTokens int) (result, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "ignore_eos": true, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": prompt}},
	})
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return result{}, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	r := result{start: start, endpoint: resp.Header.Get("X-Kvgate-Endpoint")}
	var last time.Time
	tokens := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: {")) {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(line[len("data: "):], &chunk); err != nil {
			return r, err
		}
		if chunk.Usage != nil {
			r.cached = chunk.Usage.Details.Cached
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			now := time.Now()
			if tokens == 0 {
				r.ttft = now.Sub(start)
			}
			tokens++
			last = now
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	r.total = time.Since(start)
	if tokens > 1 {
		r.itl = (last.Sub(start) - r.ttft) / time.Duration(tokens-1)
	}
	return r, nil
}

type gpuResult struct {
	ttfts     []time.Duration
	peakQueue int
}

// gateway is kvgate serve run in-process in front of the fleet.
type gateway struct {
	g    *gw.Gateway
	addr string
	eps  []string
}

// startGateway serves kvgate's gateway on a free loopback port until ctx ends.
func startGateway(ctx context.Context, fleet []*simserver.Server) (*gateway, error) {
	g := gw.New(gw.Options{Logger: slog.New(slog.DiscardHandler)})
	var eps []string
	for _, s := range fleet {
		eps = append(eps, s.Addr())
	}
	d := &gateway{g: g, eps: eps}
	if err := d.use("round-robin"); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close(); g.Close() }()
	d.addr = ln.Addr().String()
	return d, nil
}

// use applies a configuration with the named picker, as a hot reload would.
func (d *gateway) use(picker string) error {
	return d.g.Apply(&v1alpha1.InferenceGatewayConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "demo"},
		Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{{
			Name: "llama-8b", ModelName: model, Endpoints: d.eps, Picker: picker,
		}}},
	})
}

// load replays the trace through the gateway, open loop (each request leaves at
// its arrival time), and collects TTFT per GPU of the endpoint that served each
// request, the deepest queue each GPU kind showed, and a record per request.
func load(ctx context.Context, base string, gpuOf map[string]string, fleet []*simserver.Server, trace workload.Trace) (map[string]*gpuResult, []report.Record, error) {
	res := map[string]*gpuResult{"h100": {}, "a10g": {}}
	recs := make([]report.Record, len(trace))
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	stopPoll := make(chan struct{})
	var poller sync.WaitGroup
	defer poller.Wait()
	defer close(stopPoll)
	defer wg.Wait()
	poller.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopPoll:
				return
			case <-t.C:
				for _, s := range fleet {
					q := s.Waiting()
					mu.Lock()
					r := res[s.Engine().GPU]
					r.peakQueue = max(r.peakQueue, q)
					mu.Unlock()
				}
			}
		}
	})
	start := time.Now()
	for i, q := range trace {
		at := start.Add(time.Duration(q.At * float64(time.Second)))
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		prompt := longPrompt(1000+i, q.PromptTokens())
		wg.Go(func() {
			r, err := stream(ctx, base, model, prompt, q.OutputTokens)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				recs[i] = report.Record{Arrival: at.Sub(start), Error: true}
				return
			}
			// Timed from the scheduled arrival, as the benchmark does.
			late := r.start.Sub(at)
			recs[i] = report.Record{Arrival: at.Sub(start), TTFT: r.ttft + late, E2E: r.total + late, OutputTokens: q.OutputTokens, PromptTokens: q.PromptTokens()}
			mu.Lock()
			if g := res[gpuOf[r.endpoint]]; g != nil {
				g.ttfts = append(g.ttfts, r.ttft)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, nil, err
	default:
	}
	return res, recs, nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", d.Seconds()*1000)
}
