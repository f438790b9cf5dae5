// Package demo runs kvgate's end-to-end demonstration on an embedded default: a
// simulated fleet on loopback and real streaming traffic against it, with a report
// of what happened.
package demo

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	gw "github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// Options tune the demo.
type Options struct {
	LoadDuration time.Duration // nominal length of the load phase; 0 means 15 s
	Rate         float64       // nominal mean requests per second in the load phase; 0 means 6
	Seed         uint64
	// Out, when set, receives results.json, report.md and plots of the load phase.
	Out string
	// ProgressEvery is how often a load phase says how far it has got; 0 means 5 s.
	ProgressEvery time.Duration
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
	if opts.ProgressEvery == 0 {
		opts.ProgressEvery = 5 * time.Second
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
	spec := loadSpec(opts)
	trace, err := workload.Generate(spec)
	if err != nil {
		return err
	}
	sh := shapeOf(spec, trace)
	fmt.Fprintf(out, "\n4. Through kvgate serve (http://%s), the same bursty chat trace twice:\n   %s.\n", gw.addr, sh.summary())
	fmt.Fprintln(out, "   First with the round-robin picker (what a plain load balancer does), then, after a hot reload")
	fmt.Fprintln(out, "   of the configuration, with kvgate's GPU-aware picker (scraped queue and KV cache, its own")
	fmt.Fprintln(out, "   dispatches counted between scrapes):")
	var servers []report.Server
	for _, s := range fleet {
		servers = append(servers, report.Server{Endpoint: s.Addr(), Name: s.Name(), GPU: s.Engine().GPU})
	}
	var results []report.Result
	for i, picker := range []string{"round-robin", "kvgate"} {
		if err := gw.use(picker); err != nil {
			return err
		}
		fmt.Fprintln(out)
		ph := phase{base: "http://" + gw.addr, fleet: fleet, trace: trace, promptSeed: promptSeed(i),
			progress: &progress{w: out, label: picker, total: len(trace), every: opts.ProgressEvery}}
		recs, peaks, err := ph.run(ctx)
		if err != nil {
			return err
		}
		res := report.Summarize("demo", picker, "live", recs)
		results = append(results, res)
		fmt.Fprintf(out, "\n   picker %s:\n", picker)
		printShares(out, servers, res, peaks)
	}
	fmt.Fprintln(out, "\n   Round-robin sends the A10G pods as much as the H100s and their queues grow; kvgate reads")
	fmt.Fprintln(out, "   every pod's queue and KV cache and sends the work where it will start soonest.")
	fmt.Fprintln(out)
	sc := []report.Scenario{{Name: "demo", Baseline: "round-robin", Description: description(opts, spec, sh),
		Servers: servers, NoSharedPrefixes: !anyCached(results)}}
	report.Summary(out, sc, results)
	if opts.Out != "" {
		header := fmt.Sprintf("# kvgate demo\n\nCommand: `kvgate demo --seed %d --rate %g --duration %s`.", opts.Seed, opts.Rate, opts.LoadDuration)
		if err := report.Write(opts.Out, sc, results, header); err != nil {
			return err
		}
		fmt.Fprintf(out, "\nreport: %s   plots: %s\n", filepath.Join(opts.Out, "report.md"), filepath.Join(opts.Out, "plots"))
	}
	fmt.Fprintln(out, "\nThe whole comparison in virtual time, against more policies and scenarios: kvgate bench --suite aws")
	return nil
}

// loadSpec is the load phases' trace: bursty chat at the options' nominal rate.
// The trace's seed is the demo's + 1, as it has always been, so that a given
// --seed keeps giving the trace the recorded runs used.
func loadSpec(opts Options) workload.Spec {
	return workload.Spec{Kind: workload.Bursty, Seed: opts.Seed + 1, Rate: opts.Rate, Model: model,
		Requests:    max(1, int(opts.Rate*opts.LoadDuration.Seconds())),
		BurstFactor: 5, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second,
		PromptTokens: workload.Dist{Mean: 1500, Sigma: 0.5, Min: 500, Max: 4000},
		OutputTokens: workload.Dist{Mean: 200, Sigma: 0.5, Min: 50, Max: 400}}
}

// promptSeed is the longPrompt seed of load phase i's first request. Each phase
// gets texts of its own, of the trace's lengths: the simulated servers keep
// prompts in their prefix caches, and the second phase replaying the first one's
// texts would find them there wherever it sent a request to the same server.
func promptSeed(i int) int { return 1000 + i*1_000_000 }

// description is the report's paragraph on the scenario: the fleet, and the
// workload as it ran, from the spec's parameters and the trace's own figures.
func description(opts Options, spec workload.Spec, sh shape) string {
	var b strings.Builder
	b.WriteString("2 H100 and 2 A10G simulated servers of Llama-3.1-8B behind kvgate serve; the same bursty streaming " +
		"chat trace through each picker, sent open loop (each request at its arrival time, however slowly earlier ones " +
		"are answered), with TTFT timed from that arrival time.\n\nThe workload that ran:\n\n")
	fmt.Fprintf(&b, "- %d requests arriving over %s (first at %s, last at %s): %.1f req/s on average, %d in the busiest second.\n",
		sh.requests, secs(sh.last), secs(sh.first), secs(sh.last), sh.meanRate(), sh.peak1s)
	fmt.Fprintf(&b, "- Bursts of %s at %g× the quiet rate every %s, starting with one at 0 s: %s.\n",
		secs(spec.BurstOn), spec.BurstFactor, secs(spec.BurstOn+spec.BurstOff), sh.bursts())
	fmt.Fprintf(&b, "- Asked for %g req/s over %s, a mean over whole burst cycles: %d requests. Starting with a burst, "+
		"they all arrived in %s.\n", opts.Rate, secs(opts.LoadDuration), spec.Requests, secs(sh.last))
	fmt.Fprintf(&b, "- Prompts: %s tokens in this trace, drawn %s.\n", sh.prompt, spec.PromptTokens)
	fmt.Fprintf(&b, "- Outputs: %s tokens in this trace, drawn %s, every one generated in full (ignore_eos).\n", sh.output, spec.OutputTokens)
	fmt.Fprintf(&b, "- Workload seed %d (the demo's --seed %d, plus one); model %s. Every prompt is its own text, "+
		"each phase's too, so no two share a prefix.", spec.Seed, opts.Seed, spec.Model)
	return b.String()
}

// anyCached says whether a server reported a prefix-cache hit in the load
// phases. The trace shares no prefix by construction, so the report says that
// rather than a 0% hit rate; should a server report hits all the same, the rate
// is shown.
func anyCached(results []report.Result) bool {
	for _, r := range results {
		for _, rec := range r.Records {
			if rec.CachedTokens > 0 {
				return true
			}
		}
	}
	return false
}

// shape is what a trace looked like, from its own arrivals and lengths rather
// than from the spec's nominal rate and duration, which a bursty trace that
// starts with a burst does not keep.
type shape struct {
	requests    int
	first, last time.Duration // first and last arrival, from the start of the phase
	on, off     time.Duration // the spec's burst and quiet windows
	inBursts    int           // requests that arrived within a burst window
	peak1s      int           // most arrivals within one second
	prompt      lengths
	output      lengths
}

func shapeOf(spec workload.Spec, t workload.Trace) shape {
	sh := shape{requests: len(t), on: spec.BurstOn, off: spec.BurstOff}
	if len(t) == 0 {
		return sh
	}
	var prompts, outputs []int
	cycle := (spec.BurstOn + spec.BurstOff).Seconds()
	for i, q := range t {
		if cycle > 0 && math.Mod(q.At, cycle) < spec.BurstOn.Seconds() {
			sh.inBursts++
		}
		j, _ := slices.BinarySearchFunc(t[i:], q.At+1, func(r workload.Request, at float64) int { return cmp.Compare(r.At, at) })
		sh.peak1s = max(sh.peak1s, j)
		prompts, outputs = append(prompts, q.PromptTokens()), append(outputs, q.OutputTokens)
	}
	sh.first, sh.last = seconds(t[0].At), seconds(t[len(t)-1].At)
	sh.prompt, sh.output = lengthsOf(prompts), lengthsOf(outputs)
	return sh
}

// meanRate is requests per second from the start of the phase to the last arrival.
func (sh shape) meanRate() float64 {
	if sh.last <= 0 {
		return 0
	}
	return float64(sh.requests) / sh.last.Seconds()
}

// windows splits the time up to the last arrival into the burst windows begun by
// then, the time spent in them and in quiet ones.
func (sh shape) windows() (bursts int, burstTime, quietTime time.Duration) {
	cycle := sh.on + sh.off
	if cycle <= 0 {
		return 0, 0, sh.last
	}
	full := sh.last / cycle
	rest := sh.last - full*cycle
	return int(full) + 1, full*sh.on + min(rest, sh.on), full*sh.off + max(rest-sh.on, 0)
}

// bursts says how the trace's arrivals fell into its bursts and quiet spells.
func (sh shape) bursts() string {
	n, on, off := sh.windows()
	s := fmt.Sprintf("%s brought %d requests (%.0f%%)", plural(n, "burst"), sh.inBursts, 100*float64(sh.inBursts)/float64(max(sh.requests, 1)))
	if on > 0 {
		s += fmt.Sprintf(" at %.1f req/s", float64(sh.inBursts)/on.Seconds())
	}
	quiet := sh.requests - sh.inBursts
	if off > 0 {
		return s + fmt.Sprintf(", the quiet spells between them %d at %.1f req/s", quiet, float64(quiet)/off.Seconds())
	}
	return s + ", before any quiet spell"
}

// summary is the shape in one line for the terminal.
func (sh shape) summary() string {
	n, on, off := sh.windows()
	s := fmt.Sprintf("%d requests over %s (%.1f req/s on average)", sh.requests, secs(sh.last), sh.meanRate())
	if on > 0 && off > 0 {
		s += fmt.Sprintf(",\n   starting with a burst: %s of %s at %.1f req/s, quiet spells of %s at %.1f req/s", plural(n, "burst"), secs(sh.on),
			float64(sh.inBursts)/on.Seconds(), secs(sh.off), float64(sh.requests-sh.inBursts)/off.Seconds())
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// lengths summarizes token counts.
type lengths struct {
	min, median, max int
	mean             float64
}

func lengthsOf(xs []int) lengths {
	if len(xs) == 0 {
		return lengths{}
	}
	s := slices.Sorted(slices.Values(xs))
	sum := 0
	for _, x := range s {
		sum += x
	}
	return lengths{min: s[0], median: s[(len(s)-1)/2], max: s[len(s)-1], mean: float64(sum) / float64(len(s))}
}

func (l lengths) String() string {
	return fmt.Sprintf("mean %.0f, median %d, %d–%d", l.mean, l.median, l.min, l.max)
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// secs writes a duration as "10.8 s", or "2 s" when whole.
func secs(d time.Duration) string {
	return strconv.FormatFloat(math.Round(d.Seconds()*10)/10, 'f', -1, 64) + " s"
}

// printShares is the terminal's short form of the report's per-server table:
// per GPU type, what it served (and each of its servers), its TTFT and the
// deepest queue it showed. The numbers come from report.Shares, the report's own,
// so that the terminal and the report cannot disagree.
func printShares(out io.Writer, servers []report.Server, res report.Result, peaks map[string]int) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "     GPU\tserved\tTTFT p50\tTTFT p95\tpeak queue")
	var each []string
	for _, s := range report.Shares(servers, res) {
		switch {
		case s.GPU == "":
			fmt.Fprintf(w, "     none\t%d (failed)\t\t\t\n", s.Requests)
		case !s.Total:
			each = append(each, fmt.Sprintf("%s %d", s.Server, s.Requests))
		default:
			fmt.Fprintf(w, "     %s\t%d (%s)\t%s\t%s\t%d\n", s.GPU, s.Requests, strings.Join(each, ", "),
				msf(s.TTFTP50ms), msf(s.TTFTP95ms), peaks[s.GPU])
			each = nil
		}
	}
	fmt.Fprintf(w, "     all\t%d\t%s\t%s\t\n", res.Requests, msf(res.TTFTP50ms), msf(res.TTFTP95ms))
	_ = w.Flush()
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

// gateway is kvgate serve run in-process in front of the fleet.
type gateway struct {
	core *route.Router
	addr string
	eps  []string
}

// startGateway serves kvgate's gateway on a free loopback port until ctx ends.
func startGateway(ctx context.Context, fleet []*simserver.Server) (*gateway, error) {
	quiet := slog.New(slog.DiscardHandler)
	core := route.New(route.Options{Logger: quiet})
	var eps []string
	for _, s := range fleet {
		eps = append(eps, s.Addr())
	}
	d := &gateway{core: core, eps: eps}
	if err := d.use("round-robin"); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: gw.New(core, gw.Options{Logger: quiet}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close(); core.Close() }()
	d.addr = ln.Addr().String()
	return d, nil
}

// use applies a configuration with the named picker, as a hot reload would.
func (d *gateway) use(picker string) error {
	return d.core.Apply(&v1alpha1.InferenceGatewayConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "demo"},
		// The demo reports which GPU served each request (x-kvgate-endpoint).
		Spec: v1alpha1.InferenceGatewayConfigSpec{Schedulers: []v1alpha1.SchedulerSpec{{
			Name: "llama-8b", ModelName: model, Endpoints: d.eps, Picker: picker,
		}}, Gateway: v1alpha1.GatewaySpec{Diagnostics: &v1alpha1.DiagnosticsSpec{Expose: true}}},
	})
}

// phase is one load phase: the trace replayed through the gateway.
type phase struct {
	base       string // the gateway, http://host:port
	fleet      []*simserver.Server
	trace      workload.Trace
	promptSeed int // longPrompt's seed for the first request, +1 for each next one
	progress   *progress
}

// run replays the trace open loop (each request leaves at its arrival time) and
// returns a record per request and the deepest queue each GPU type showed.
func (p phase) run(ctx context.Context) ([]report.Record, map[string]int, error) {
	peaks := map[string]int{}
	recs := make([]report.Record, len(p.trace))
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	stop := make(chan struct{})
	var background sync.WaitGroup
	defer background.Wait()
	defer close(stop)
	defer wg.Wait()
	background.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				for _, s := range p.fleet {
					q := s.Waiting()
					mu.Lock()
					peaks[s.Engine().GPU] = max(peaks[s.Engine().GPU], q)
					mu.Unlock()
				}
			}
		}
	})
	start := time.Now()
	var span time.Duration
	if len(p.trace) > 0 {
		span = seconds(p.trace[len(p.trace)-1].At)
	}
	p.progress.begin(span)
	// The progress lines stop before the phase's last line is written, so that the
	// two never interleave.
	ticking := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Go(func() { p.progress.report(start, ticking) })
	stopTicking := sync.OnceFunc(func() { close(ticking); ticker.Wait() })
	defer stopTicking()
	for i, q := range p.trace {
		at := start.Add(seconds(q.At))
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		prompt := longPrompt(p.promptSeed+i, q.PromptTokens())
		p.progress.sent.Add(1)
		wg.Go(func() {
			defer p.progress.done.Add(1)
			r, err := stream(ctx, p.base, model, prompt, q.OutputTokens)
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
			recs[i] = report.Record{Arrival: at.Sub(start), TTFT: r.ttft + late, E2E: r.total + late,
				OutputTokens: q.OutputTokens, PromptTokens: q.PromptTokens(), CachedTokens: r.cached, Endpoint: r.endpoint}
		})
	}
	wg.Wait()
	stopTicking()
	p.progress.end(time.Since(start))
	select {
	case err := <-errs:
		return nil, nil, err
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	return recs, maps.Clone(peaks), nil
}

// progress tells, while a load phase runs, how far it has got: a phase lasts
// half a minute, and that long a silence reads as a hang.
type progress struct {
	w     io.Writer
	label string
	total int
	every time.Duration
	sent  atomic.Int64 // requests sent so far
	done  atomic.Int64 // requests answered or failed so far
}

func (p *progress) begin(span time.Duration) {
	fmt.Fprintf(p.w, "   %s: sending %d requests over ~%s, open loop, then waiting for the last answers …\n",
		p.label, p.total, secs(span.Round(time.Second)))
}

// report writes a line every p.every from start until done closes.
func (p *progress) report(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			sent, answered := p.sent.Load(), p.done.Load()
			fmt.Fprintf(p.w, "   %s: %s in, %d/%d sent, %d answered, %d in flight\n",
				p.label, secs(time.Since(start).Round(time.Second)), sent, p.total, answered, sent-answered)
		}
	}
}

func (p *progress) end(elapsed time.Duration) {
	fmt.Fprintf(p.w, "   %s: done, %d requests answered in %s\n", p.label, p.done.Load(), secs(elapsed))
}

func ms(d time.Duration) string { return msf(d.Seconds() * 1000) }

// msf writes milliseconds as "123 ms", or "12.3 s" from ten seconds on.
func msf(v float64) string {
	if v >= 10_000 {
		return fmt.Sprintf("%.1f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}
