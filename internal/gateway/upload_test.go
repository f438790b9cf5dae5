package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvgate/kvgate/internal/simserver"
)

// The uploads of TestSlowUploadsTeachNothing: five clients each send a 40 KB
// streamed chat body, "model" first. Its first uploadHead bytes (the model
// and the 16 KB of prompt the prefix index reads) go at once, so the pick
// comes at once and the gateway streams the body on while the rest trickles
// at uploadRate: for 12 s each upload is picked, at its pod, and not all
// there.
const (
	uploaders   = 5
	uploadBytes = 40 << 10
	uploadHead  = 16<<10 + 200
	uploadRate  = 2 << 10 // bytes a second
)

// TestSlowUploadsTeachNothing: while clients upload slowly to pods of equal
// speed, those pods share the other traffic about evenly (a pending upload is
// no work at its pod until its body is all there), and once the uploads are
// answered every pod's learned speed is still about what the other traffic
// taught (an endpoint's time to first token runs from the request's last
// byte written, not from the pick). Before, one pod took all the traffic while
// the uploads ran, and the pods learned speeds tens of times too slow.
func TestSlowUploadsTeachNothing(t *testing.T) {
	const pods = 3
	var addrs []string
	for range pods {
		_, a := startSim(t, llama, simserver.Options{})
		addrs = append(addrs, a)
	}
	g, base := startGateway(t, gatewayConfig(scheduler("p", llama, addrs...)))
	waitScraped(t, g, addrs...)
	// speeds are the pods' learned times to first token of a 512-token
	// prompt on an idle pod, of those with at least samples answers of their
	// own.
	speeds := func(samples int) map[string]float64 {
		out := map[string]float64{}
		for _, e := range g.FleetView()[0].Endpoints {
			if !e.Speed.Borrowed && e.Speed.Samples >= samples {
				out[e.Address] = e.Speed.TTFT(512, 0, 0, 0)
			}
		}
		return out
	}

	ctx, stop := context.WithTimeout(context.Background(), 40*time.Second)
	defer stop()
	load := startChatLoad(ctx, t, base, 6)

	// Warm-up: until every pod's speed is its own, learned from as many
	// answers as the fit weighs (about the last 20).
	for len(speeds(20)) < pods {
		if ctx.Err() != nil || time.Since(load.began) > 10*time.Second {
			t.Fatalf("after %v of traffic some pod has not learned its speed from 20 answers: %+v", time.Since(load.began), g.FleetView()[0].Endpoints)
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := speeds(20)
	known := slices.Sorted(maps.Values(before))
	ref := known[len(known)/2]

	// The uploads, and the window they are all picked and still arriving.
	type result struct {
		status int
		served string
		err    error
	}
	results := make(chan result, uploaders)
	var heads, tails sync.WaitGroup
	heads.Add(uploaders)
	tails.Add(uploaders)
	for i := range uploaders {
		go func() {
			st, ep, err := slowUpload(ctx, strings.TrimPrefix(base, "http://"), uploadBody(i), heads.Done, tails.Done)
			results <- result{st, ep, err}
		}()
	}
	heads.Wait()
	from := time.Now()
	tails.Wait()
	to := time.Now()
	uploadedTo := map[string]int{}
	for range uploaders {
		select {
		case r := <-results:
			if r.err != nil || r.status != http.StatusOK {
				t.Errorf("an upload ended with %d: %v", r.status, r.err)
			}
			uploadedTo[r.served]++
		case <-ctx.Done():
			t.Fatal("an upload was not answered within the test's bound")
		}
	}
	after := speeds(0)
	answers := load.stop()

	// (1) The traffic begun and ended while every upload was picked and
	// still arriving. Were the pods picked at random, ignoring load, a pod's
	// count of n would be binomial(n, 1/pods); Hoeffding's inequality bounds
	// its share's distance from 1/pods beyond m by 2·exp(-2·n·m²). m is set
	// for that to be 1e-4 for any of the pods: a load-aware picker spreads
	// like pods more evenly than chance, so the bound holds however slow a
	// busy machine makes the traffic (it gives n ≈ 950 idle, 900 under the
	// race detector: m ≈ 0.08), as long as n is large enough for m to rule
	// out one pod taking all of it (n ≥ 100: m ≤ 0.24).
	count := map[string]int{}
	n := 0
	for _, r := range answers {
		if r.began.After(from) && r.ended.Before(to) {
			count[r.endpoint]++
			n++
		}
	}
	m := math.Sqrt(math.Log(2*pods/1e-4) / (2 * float64(n)))
	t.Logf("the uploads went %v and took %v after their heads; %d requests in that window went %v (each within %.2f of %.2f wanted)", uploadedTo, to.Sub(from).Round(time.Millisecond), n, count, m, 1.0/pods)
	if n < 100 {
		t.Fatalf("only %d requests ran while the uploads did: too few to tell a share", n)
	}
	for _, a := range addrs {
		if share := float64(count[a]) / float64(n); math.Abs(share-1.0/pods) > m {
			t.Errorf("%s took %.2f of the traffic while the uploads ran, want %.2f ± %.2f: %v", a, share, 1.0/pods, m, count)
		}
	}

	// (2) The learned speeds: each pod's prediction for a 512-token prompt
	// on an idle pod, within 3× of the others' and of the pool's median
	// before the uploads, so that pods all made slow alike fail too (the
	// pods are alike; a 12 s upload timed as the pod's work made them
	// 20-200× slower).
	t.Logf("learned TTFT(512) before the uploads %v (median %.4f s), after %v", before, ref, after)
	lo, hi := math.Inf(1), 0.0
	for _, a := range addrs {
		s, ok := after[a]
		if !ok {
			t.Errorf("%s borrows its speed after the uploads", a)
			continue
		}
		lo, hi = min(lo, s), max(hi, s)
		if s > 3*ref || s < ref/3 {
			t.Errorf("%s learned TTFT(512) %.4f s after the uploads, the pool's median %.4f s before: want within 3×", a, s, ref)
		}
	}
	if hi > 3*lo {
		t.Errorf("learned TTFT(512) after the uploads %v: want every pod within 3× of the others", after)
	}
}

// uploadBody is a streamed chat request of uploadBytes, "model" first, its
// prompt unique to i (no two uploads share a prefix).
func uploadBody(i int) []byte {
	open := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":4,"messages":[{"role":"user","content":"upload %d:`, llama, i)
	const end = `"}]}`
	words := strings.Repeat(" lorem", (uploadBytes-len(open)-len(end))/6+1)
	return []byte(open + words[:uploadBytes-len(open)-len(end)] + end)
}

// slowUpload sends body over a raw connection: its first uploadHead bytes at
// once (headed runs then), the rest at uploadRate (sent runs once it is all
// written), and reads the answer. It returns the status and the endpoint
// that served it; ctx bounds it all.
func slowUpload(ctx context.Context, host string, body []byte, headed, sent func()) (int, string, error) {
	headOnce, sentOnce := sync.OnceFunc(headed), sync.OnceFunc(sent)
	defer headOnce()
	defer sentOnce()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return 0, "", fmt.Errorf("dialing the gateway: %w", err)
	}
	defer c.Close()
	if at, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(at)
	}
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		return 0, "", fmt.Errorf("writing the headers: %w", err)
	}
	if _, err := c.Write(body[:uploadHead]); err != nil {
		return 0, "", fmt.Errorf("writing the body's head: %w", err)
	}
	headOnce()
	// A tenth of a second's bytes every tenth of a second.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for rest := body[uploadHead:]; len(rest) > 0; {
		select {
		case <-ctx.Done():
			return 0, "", fmt.Errorf("uploading: %w", ctx.Err())
		case <-tick.C:
		}
		k := min(len(rest), uploadRate/10)
		if _, err := c.Write(rest[:k]); err != nil {
			return 0, "", fmt.Errorf("uploading: %w", err)
		}
		rest = rest[k:]
	}
	sentOnce()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("reading the answer's body: %w", err)
	}
	if resp.StatusCode == http.StatusOK && !strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
		return resp.StatusCode, "", errors.New("the stream did not end with [DONE]")
	}
	return resp.StatusCode, resp.Header.Get("X-Kvgate-Endpoint"), nil
}

// loadAnswer is one request of the other traffic: when it began and ended, and
// the endpoint that served it.
type loadAnswer struct {
	began, ended time.Time
	endpoint     string
}

// chatLoad is closed-loop clients of streamed chats through the SDK, each
// sending its next request as its last ends, every prompt unique.
type chatLoad struct {
	began  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	done   []loadAnswer
	errs   []error
}

func startChatLoad(ctx context.Context, t *testing.T, base string, clients int) *chatLoad {
	ctx, cancel := context.WithCancel(ctx)
	cl := &chatLoad{began: time.Now(), cancel: cancel}
	c := sdk(base)
	filler := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40) // about 400 tokens
	for i := range clients {
		cl.wg.Go(func() {
			for j := 0; ctx.Err() == nil; j++ {
				var ep string
				began := time.Now()
				s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
					Model:     llama,
					Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("client %d request %d: %s", i, j, filler))},
					MaxTokens: openai.Int(8),
				}, servedBy(&ep))
				for s.Next() {
				}
				err := s.Err()
				_ = s.Close()
				cl.mu.Lock()
				switch {
				case err == nil:
					cl.done = append(cl.done, loadAnswer{began, time.Now(), ep})
				case ctx.Err() == nil:
					cl.errs = append(cl.errs, err)
				}
				cl.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() {
		cl.stop()
		for _, err := range cl.errs {
			t.Errorf("a request of the other traffic failed: %v", err)
		}
	})
	return cl
}

// stop ends the traffic, waits for its clients, and returns what was served.
func (cl *chatLoad) stop() []loadAnswer {
	cl.cancel()
	cl.wg.Wait()
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.done
}
