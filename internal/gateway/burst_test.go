package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

// The burst of TestBurstOnMixedSpeeds: this many streamed chats of about
// burstPrompt tokens each, released together on an idle pool.
const (
	burstRequests = 30
	burstPrompt   = 512
)

// TestBurstOnMixedSpeeds: two H100s and an A10G serving Llama-3.1-8B, each
// having learned its own speed and all idle, take a burst of 30 unique
// 512-token prompts at once. The A10G gets no more than its share of the
// pool's prefill capacity (by the simulator's own cost model) plus 2, and the
// H100s together more than it: a burst on an idle pool must not be spread as
// if the pods were alike.
func TestBurstOnMixedSpeeds(t *testing.T) {
	ctx, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()

	gpus := []string{"h100", "h100", "a10g"}
	var addrs []string
	gpuOf := map[string]string{}
	capacity := map[string]float64{} // prompts of burstPrompt tokens a second
	total := 0.0
	for _, gpu := range gpus {
		cfg := sim.Config{GPU: gpu, ModelSize: "8b"}
		ttft, err := sim.MeasureTTFT(cfg, burstPrompt)
		if err != nil {
			t.Fatalf("the simulator's TTFT of a %d-token prompt on %s: %v", burstPrompt, gpu, err)
		}
		_, a := startSim(t, llama, simserver.Options{Engine: cfg})
		addrs = append(addrs, a)
		gpuOf[a] = gpu
		capacity[a] = 1 / ttft.Seconds()
		total += capacity[a]
		t.Logf("%s (%s): TTFT(%d) %v on an idle engine", a, gpu, burstPrompt, ttft)
	}
	slow := addrs[2]
	share := capacity[slow] / total * burstRequests
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, addrs...)))
	waitScraped(t, g, addrs...)

	// Warm-up: traffic until every endpoint's speed is its own. An
	// endpoint's first answers rate the A10G some 4× slower and a borrowed
	// speed is never probed, so the load must be heavy enough that the
	// H100s' queues make the A10G worth picking: as many clients as the
	// burst has requests.
	load := startChatLoad(ctx, t, base, burstRequests)
	until(ctx, t, "every endpoint to learn its own speed", func() bool {
		for _, e := range g.FleetView()[0].Endpoints {
			if e.Speed.Borrowed {
				return false
			}
		}
		return true
	}, func() any { return g.FleetView()[0].Endpoints })
	warm := load.stop()
	warmed := map[string]int{}
	for _, a := range warm {
		warmed[a.endpoint]++
	}
	quietSince := time.Now()
	t.Logf("warmed up in %v: %v", quietSince.Sub(load.began).Round(time.Millisecond), warmed)

	// Idle at a scrape taken after the warm-up's last answer.
	until(ctx, t, "every endpoint to read idle at a scrape after the warm-up", func() bool {
		since := time.Since(quietSince)
		for _, s := range g.Snapshot(addrs) {
			if !s.Healthy || s.Stale || s.Age >= since || s.Running != 0 || s.Waiting != 0 || s.Pending != 0 || s.PrefillTokens != 0 {
				return false
			}
		}
		return true
	}, func() any { return g.Snapshot(addrs) })

	// The burst, released together.
	results := make([]burstResult, burstRequests)
	release := make(chan struct{})
	var ready, done sync.WaitGroup
	c := sdk(base)
	for i := range burstRequests {
		ready.Add(1)
		done.Go(func() {
			r := &results[i]
			params := openai.ChatCompletionNewParams{
				Model:     llama,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(burstPromptText(i))},
				MaxTokens: openai.Int(8),
			}
			ready.Done()
			select {
			case <-release:
			case <-ctx.Done():
				r.err = ctx.Err()
				return
			}
			s := c.Chat.Completions.NewStreaming(ctx, params, r.observe(), option.WithHeader("X-Kvgate-Explain", "1"))
			for s.Next() {
			}
			r.err = s.Err()
			_ = s.Close()
		})
	}
	ready.Wait()
	close(release)
	done.Wait()

	served := map[string]int{}
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("burst request %d: %v", i, r.err)
		case r.status != http.StatusOK:
			t.Errorf("burst request %d: status %d", i, r.status)
		case !strings.HasSuffix(string(r.tail), "data: [DONE]\n\n"):
			t.Errorf("burst request %d did not end with [DONE]: ...%q", i, r.tail)
		}
		served[r.endpoint]++
	}
	split := func() string {
		var b strings.Builder
		for _, a := range addrs {
			fmt.Fprintf(&b, " %s=%d", gpuOf[a], served[a])
		}
		return strings.TrimSpace(b.String())
	}()
	t.Logf("the burst of %d went %s; the A10G's capacity share is %.2f (allowed %.2f)", burstRequests, split, share, share+2)

	fast := served[addrs[0]] + served[addrs[1]]
	if float64(served[slow]) > share+2 || fast <= served[slow] {
		t.Errorf("burst split %s: want the A10G at most %.2f (its capacity share %.2f plus 2) and the H100s together more than it", split, share+2, share)
		for i, r := range results {
			t.Logf("request %d → %s: %s", i, gpuOf[r.endpoint], r.scores)
		}
	}
}

// burstResult is what one burst request saw: the response's status, the
// endpoint that served it, the per-candidate scores, and the stream's last
// bytes.
type burstResult struct {
	status   int
	endpoint string
	scores   string
	tail     []byte
	err      error
}

// observe records the response into r, keeping the body's last bytes as the
// SDK reads it (the SDK hides the stream's [DONE]).
func (r *burstResult) observe() option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(req)
		if err != nil {
			return resp, err
		}
		r.status = resp.StatusCode
		r.endpoint = resp.Header.Get("X-Kvgate-Endpoint")
		r.scores = resp.Header.Get("X-Kvgate-Scores")
		resp.Body = &tailReader{ReadCloser: resp.Body, tail: &r.tail}
		return resp, nil
	})
}

// tailReader keeps the last 64 bytes read through it.
type tailReader struct {
	io.ReadCloser
	tail *[]byte
}

func (t *tailReader) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	*t.tail = append(*t.tail, p[:n]...)
	if k := len(*t.tail); k > 64 {
		*t.tail = append((*t.tail)[:0], (*t.tail)[k-64:]...)
	}
	return n, err
}

// burstPromptText is a prompt of about burstPrompt tokens, unique to i from
// its first token (no two share a cached prefix).
func burstPromptText(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "burst %d:", i)
	for tokenizer.Count(b.String()) < burstPrompt {
		b.WriteString(" the quick brown fox jumps over the lazy dog")
	}
	return b.String()
}

// until polls cond until it holds, failing the test with what state returns
// when ctx ends first.
func until(ctx context.Context, t *testing.T, what string, cond func() bool, state func() any) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; state %+v", what, ctx.Err(), state())
		case <-tick.C:
		}
	}
}
