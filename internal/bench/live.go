package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/report"
	"github.com/kvgate/kvgate/internal/workload"
)

// LiveConfig configures `kvgate bench --mode live`.
type LiveConfig struct {
	// Targets are OpenAI-compatible base URLs (http://host:port), each named for
	// the report: "nginx=http://127.0.0.1:8201"; a bare URL is named "target".
	Targets []string
	// Requests caps how many of the trace's requests are sent (0: all).
	Requests int
	// Rate, when positive, rescales the trace's arrival times to this mean rate.
	Rate float64
	// Timeout bounds one request (default 5 min).
	Timeout time.Duration
	// MaxConcurrency bounds requests in flight; an arrival beyond it waits, and its
	// wait counts in its latency (default 4096).
	MaxConcurrency int
	// Pause between targets, for queues to drain (default 5 s).
	Pause time.Duration
	// MaxTokens, when positive, caps every request's output (a shorter run).
	MaxTokens int
}

func runLive(ctx context.Context, w io.Writer, cfg Config) error {
	lc := cfg.Live
	if len(lc.Targets) == 0 {
		return errors.New("live mode needs --target URL")
	}
	if lc.Timeout == 0 {
		lc.Timeout = 5 * time.Minute
	}
	if lc.MaxConcurrency == 0 {
		lc.MaxConcurrency = 4096
	}
	if lc.Pause == 0 {
		lc.Pause = 5 * time.Second
	}
	scenarios, traces, err := selectScenarios(cfg)
	if err != nil {
		return err
	}
	type target struct{ name, url string }
	var targets []target
	for _, t := range lc.Targets {
		name, url, ok := strings.Cut(t, "=")
		if !ok {
			name, url = "target", t
		}
		if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
			return fmt.Errorf("target %q: want http://host:port", t)
		}
		targets = append(targets, target{name, strings.TrimRight(url, "/")})
	}
	var results []report.Result
	// Prompts of their own for every scenario, target and run: a model server's
	// prefix cache keeps what an earlier run sent.
	nonce := time.Now().UnixNano()
	for i, s := range scenarios {
		tr := shape(traces[i], lc.Requests, lc.Rate)
		s.Description = fmt.Sprintf("The %s scenario's trace, live: %d requests at %.1f requests/s on average, sent open loop to each target in turn; "+
			"the servers are whatever the targets front. Each target gets prompts of its own (same lengths, arrivals and sharing, other words), "+
			"so that no target finds another's prompts in a prefix cache. Workload: %s.", s.Name, len(tr), meanRate(tr), workload.Describe(s.Workload))
		scenarios[i] = s
		for j, t := range targets {
			if j > 0 || i > 0 {
				select {
				case <-time.After(lc.Pause):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			fmt.Fprintf(w, "%s → %s (%s): %d requests\n", s.Name, t.name, t.url, len(tr))
			recs, err := replayLive(ctx, w, t.url, relabel(tr, fmt.Sprintf("%s/%d/%x", s.Name, j, nonce)), lc)
			if err != nil {
				return err
			}
			results = append(results, report.Summarize(s.Name, t.name, "live", recs))
		}
		scenarios[i].Baseline = targets[0].name
	}
	return finish(w, cfg, scenarios, results)
}

// relabel gives every segment of the trace an identity of its own under tag: the
// same shape and sharing, other text.
func relabel(tr workload.Trace, tag string) workload.Trace {
	out := slices.Clone(tr)
	for i := range out {
		segs := slices.Clone(out[i].Prompt)
		for k := range segs {
			segs[k].ID = segs[k].ID + "#" + tag
		}
		out[i].Prompt = segs
	}
	return out
}

// shape cuts a trace to n requests and rescales it to rate.
func shape(tr workload.Trace, n int, rate float64) workload.Trace {
	if n > 0 && n < len(tr) {
		tr = tr[:n]
	}
	tr = slices.Clone(tr)
	if rate > 0 && len(tr) > 1 && tr[len(tr)-1].At > 0 {
		f := meanRate(tr) / rate
		for i := range tr {
			tr[i].At *= f
		}
	}
	return tr
}

func meanRate(tr workload.Trace) float64 {
	if len(tr) < 2 || tr[len(tr)-1].At <= tr[0].At {
		return 0
	}
	return float64(len(tr)-1) / (tr[len(tr)-1].At - tr[0].At)
}

// replayLive sends the trace open-loop: each request leaves at its arrival time
// whether or not earlier ones have finished, and its latencies count from that
// time, so a slow target cannot hide its queue (no coordinated omission).
func replayLive(ctx context.Context, w io.Writer, base string, tr workload.Trace, lc LiveConfig) ([]report.Record, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: lc.MaxConcurrency, MaxIdleConns: lc.MaxConcurrency, DisableCompression: true,
	}}
	defer client.CloseIdleConnections()
	recs := make([]report.Record, len(tr))
	slots := make(chan struct{}, lc.MaxConcurrency)
	var done atomic.Int64
	var mu sync.Mutex
	var ttfts []float64
	var errs int
	stop := make(chan struct{})
	progressDone := make(chan struct{})
	go func() { progress(w, len(tr), &done, &mu, &ttfts, &errs, stop); close(progressDone) }()
	start := time.Now()
	var wg sync.WaitGroup
	for i, q := range tr {
		at := start.Add(time.Duration(q.At * float64(time.Second)))
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			rec := send(ctx, client, base, q, at, lc)
			rec.Arrival = at.Sub(start)
			recs[i] = rec
			mu.Lock()
			if rec.Error {
				errs++
			} else {
				ttfts = append(ttfts, rec.TTFT.Seconds()*1000)
			}
			mu.Unlock()
			done.Add(1)
		})
	}
	wg.Wait()
	close(stop)
	<-progressDone // it writes to w too
	fmt.Fprintln(w)
	return recs, ctx.Err()
}

// progress redraws a bar with live percentiles once a second until stop.
func progress(w io.Writer, total int, done *atomic.Int64, mu *sync.Mutex, ttfts *[]float64, errs *int, stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n := int(done.Load())
		mu.Lock()
		s := slices.Clone(*ttfts)
		e := *errs
		mu.Unlock()
		slices.Sort(s)
		pct := func(p float64) float64 {
			if len(s) == 0 {
				return 0
			}
			return s[min(len(s)-1, int(p*float64(len(s))))]
		}
		const width = 30
		fill := width * n / max(total, 1)
		fmt.Fprintf(w, "\r  [%s%s] %d/%d  TTFT p50 %.0f ms  p95 %.0f ms  p99 %.0f ms  errors %d   ",
			strings.Repeat("=", fill), strings.Repeat(" ", width-fill), n, total, pct(0.5), pct(0.95), pct(0.99), e)
	}
}

// send streams one chat completion and times it from its scheduled arrival.
func send(ctx context.Context, c *http.Client, base string, q workload.Request, at time.Time, lc LiveConfig) report.Record {
	rec := report.Record{PromptTokens: q.PromptTokens()}
	model := q.Model
	if q.Adapter != "" {
		model = q.Adapter
	}
	body, _ := json.Marshal(map[string]any{
		"model":          model,
		"messages":       []map[string]string{{"role": "user", "content": workload.Text(q.Prompt)}},
		"max_tokens":     outputTokens(q, lc.MaxTokens),
		"ignore_eos":     true,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	ctx, cancel := context.WithTimeout(ctx, lc.Timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		rec.Error = true
		return rec
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		rec.Error = true
		return rec
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	chunks := 0
	finished := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimPrefix(data, []byte(" "))
		if string(data) == "[DONE]" {
			finished = true
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
				PromptTokens     int `json:"prompt_tokens"`
				Details          *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &ev) != nil || ev.Error != nil {
			rec.Error = true
			return rec
		}
		if len(ev.Choices) > 0 && (ev.Choices[0].FinishReason == "abort" || ev.Choices[0].FinishReason == "error") {
			rec.Error = true
			return rec
		}
		if len(ev.Choices) > 0 && (ev.Choices[0].Delta.Content != "" || ev.Choices[0].Delta.ReasoningContent != "") {
			if chunks == 0 {
				rec.TTFT = time.Since(at)
			}
			chunks++
		}
		if u := ev.Usage; u != nil {
			rec.OutputTokens = u.CompletionTokens
			if u.PromptTokens > 0 {
				rec.PromptTokens = u.PromptTokens
			}
			if u.Details != nil {
				rec.CachedTokens = u.Details.CachedTokens
			}
		}
	}
	if !finished || chunks == 0 {
		rec.Error = true
		return rec
	}
	rec.E2E = time.Since(at)
	if rec.OutputTokens == 0 {
		rec.OutputTokens = chunks
	}
	return rec
}

func outputTokens(q workload.Request, limit int) int {
	n := max(1, q.OutputTokens)
	if limit > 0 {
		n = min(n, limit)
	}
	return n
}
