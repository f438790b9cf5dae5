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
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
)

// Options tune the demo.
type Options struct {
	LoadDuration time.Duration // length of the load phase; 0 means 15 s
	Rate         float64       // requests per second in the load phase; 0 means 6
	Seed         uint64
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
		r, err := stream(ctx, s.Addr(), model, longPrompt(i, 2000), 64)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", s.Name(), ms(r.ttft), ms(r.itl), ms(r.total))
	}
	_ = w.Flush()

	fmt.Fprintln(out, "\n2. The same ~6,000-token prompt twice on h100-0 (automatic prefix caching):")
	doc := longPrompt(99, 6000)
	cold, err := stream(ctx, fleet[0].Addr(), model, doc, 8)
	if err != nil {
		return err
	}
	warm, err := stream(ctx, fleet[0].Addr(), model, doc, 8)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   first: TTFT %s, %d cached tokens;  again: TTFT %s, %d cached tokens\n",
		ms(cold.ttft), cold.cached, ms(warm.ttft), warm.cached)

	fmt.Fprintln(out, "\n3. A LoRA adapter on h100-1 (loaded into a GPU slot on first use):")
	first, err := stream(ctx, fleet[1].Addr(), "sql-expert", longPrompt(7, 200), 8)
	if err != nil {
		return err
	}
	again, err := stream(ctx, fleet[1].Addr(), "sql-expert", longPrompt(8, 200), 8)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   first request TTFT %s (includes the adapter load), next %s\n", ms(first.ttft), ms(again.ttft))

	fmt.Fprintf(out, "\n4. Round-robin across the mixed fleet, %.0f req/s for %s (what a plain load balancer does):\n", opts.Rate, opts.LoadDuration)
	res, err := roundRobin(ctx, fleet, opts)
	if err != nil {
		return err
	}
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  GPU\trequests\tTTFT p50\tTTFT p95\tpeak queue")
	for _, gpu := range []string{"h100", "a10g"} {
		r := res[gpu]
		fmt.Fprintf(w, "  %s\t%d\t%s\t%s\t%d\n", gpu, len(r.ttfts), ms(pct(r.ttfts, 50)), ms(pct(r.ttfts, 95)), r.peakQueue)
	}
	_ = w.Flush()
	fmt.Fprintln(out, "\n   The A10G pods queue while the H100s have room: the imbalance kvgate's GPU-aware picker removes.")
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
	ttft, itl, total time.Duration
	cached           int
}

// stream sends one streaming chat request and measures it from the client side.
func stream(ctx context.Context, addr, model, prompt string, maxTokens int) (result, error) {
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "ignore_eos": true, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": prompt}},
	})
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
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
	var r result
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

// roundRobin sends Poisson arrivals to the servers in turn and collects TTFT per
// GPU kind, and the deepest queue each kind showed.
func roundRobin(ctx context.Context, fleet []*simserver.Server, opts Options) (map[string]*gpuResult, error) {
	rng := rand.New(rand.NewPCG(opts.Seed, 99))
	res := map[string]*gpuResult{"h100": {}, "a10g": {}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	deadline := time.Now().Add(opts.LoadDuration)
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
	for i := 0; time.Now().Before(deadline); i++ {
		s := fleet[i%len(fleet)]
		prompt := longPrompt(1000+i, 1000+rng.IntN(2000))
		out := 100 + rng.IntN(200)
		wg.Go(func() {
			r, err := stream(ctx, s.Addr(), model, prompt, out)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			mu.Lock()
			g := res[s.Engine().GPU]
			g.ttfts = append(g.ttfts, r.ttft)
			mu.Unlock()
		})
		select {
		case <-time.After(time.Duration(rng.ExpFloat64() / opts.Rate * float64(time.Second))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	return res, nil
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
