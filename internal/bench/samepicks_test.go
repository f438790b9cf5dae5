package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestSamePicksAsServe: the virtual-time run routes as `kvgate serve` does. The
// run's calls into the routing core — scrapes, picks, first tokens, finishes —
// are replayed in the same order and at the same virtual times through serve's
// HTTP path: real requests to a gateway made by gateway.New and served by its
// ServeHTTP (openai.Scan, Route, proxy.Forward), its fleet fed by Observe
// instead of HTTP scrapes, forwarding to loopback upstreams that stand for the
// simulated servers and hold each response until the trace says its first
// token and its end came. Every request must reach the upstream of the server
// the bench picked. The trace loads the fleet enough for queues, KV usage, the
// dispatch accounting, prefix affinity and adapters to decide picks; a few
// prompts run past the head the prefix index hashes, and a few past what the
// servers hold (refused by the server after the pick).
func TestSamePicksAsServe(t *testing.T) {
	fl := servers("h100", "h100", "8b", 1, 4, nil)
	fl.LoRAModules = []string{"sql", "chat"}
	fl.MaxModelLen = 8192
	var tr workload.Trace
	for i := range 250 {
		q := workload.Request{At: float64(i) * 0.008, Model: llama8b, OutputTokens: 40 + i%80,
			Prompt: []workload.Segment{{ID: fmt.Sprint("system-", i%3), Tokens: 1500}, {ID: fmt.Sprint("user-", i), Tokens: 100 + i%300}}}
		switch {
		case i%5 == 0:
			q.Adapter = []string{"sql", "chat"}[i%2]
		case i%50 == 17:
			// Longer than the head the prefix index hashes (256 blocks).
			q.Prompt[1].Tokens = 3000 + i
		case i%100 == 42:
			// Longer than the servers hold: refused by the server after the pick.
			q.Prompt[1].Tokens = 7000
		}
		tr = append(tr, q)
	}
	for _, policy := range []string{"kvgate", "chat", "least-request"} {
		t.Run(policy, func(t *testing.T) {
			opts := SimOptions{Fleet: simserver.FleetSpec{Seed: 1, Servers: []simserver.ServerSpec{fl}}, Policy: policy, Seed: 7}
			var events []simEvent
			opts.record = func(e simEvent) { events = append(events, e) }
			if _, _, err := RunSim(context.Background(), opts, tr); err != nil {
				t.Fatal(err)
			}
			replayThroughServe(t, opts, tr, events)
		})
	}
}

// replayWait bounds every wait of the replay: a request that never reaches an
// upstream, or a response that never reaches the client, fails the test.
const replayWait = 10 * time.Second

// replayThroughServe replays a run's events through a gateway's ServeHTTP and
// fails unless every request goes to the server the bench picked.
func replayThroughServe(t *testing.T, opts SimOptions, tr workload.Trace, events []simEvent) {
	goroutines := runtime.NumGoroutine()
	defer checkGoroutines(t, goroutines)
	// One upstream per simulated server, in the same order.
	sims := addrsOf(events)
	ups := newUpstreams(len(sims))
	defer ups.close()
	index := map[string]int{} // the bench's address → the upstream's index
	var addrs []string
	for i, a := range sims {
		index[a] = i
		addrs = append(addrs, ups.addr(i))
	}
	cfg, err := simConfig(opts, tr, addrs)
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64 // the virtual clock
	quiet := slog.New(slog.DiscardHandler)
	core := route.New(route.Options{Logger: quiet, Seed: opts.Seed,
		Fleet: fleet.Config{Interval: 50 * time.Millisecond, StaleAfter: 2 * time.Second, UnhealthyAfter: unhealthyAfter, BlockSize: blockTokens,
			Now: func() time.Time { return epoch.Add(time.Duration(now.Load())) }, External: true}})
	defer core.Close()
	if err := core.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	g := gateway.New(core, gateway.Options{Logger: quiet})
	calls := newCalls()
	// ServeHTTP itself, and a note when it returns: Route.Finish has run by then.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.served(r.Header.Get(tagHeader))
		g.ServeHTTP(w, r)
	}))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		// Whatever is still held (a failed replay) ends with its request.
		cancel()
		front.Close()
		client.CloseIdleConnections()
	}()

	wait := func(ch <-chan struct{}, format string, args ...any) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(replayWait):
			t.Fatalf("after %v: "+format, append([]any{replayWait}, args...)...)
		}
	}
	// larger counts the bodies longer than the BodyBytes the bench routed with:
	// serve estimates a prompt's tokens from the body's size, so for those the
	// fleet's dispatch accounting differs from the bench's.
	picks, differ, larger := 0, 0, 0
	for _, e := range events {
		now.Store(int64(e.at))
		switch e.kind {
		case "scrape":
			core.Observe(ups.addr(index[e.addr]), e.metrics, engine.VLLM, epoch.Add(e.at))
		case "route":
			body := completionBody(e.model, e.prompt, e.bodyBytes)
			if int64(len(body)) > e.bodyBytes {
				larger++
			}
			c := calls.start(ctx, client, front.URL, e.tag, body)
			var h *held
			select {
			case h = <-ups.arrived:
			case err := <-c.failed:
				t.Fatalf("request %d at %v: %v", e.tag, e.at, err)
			case <-time.After(replayWait):
				t.Fatalf("request %d at %v: no upstream received it after %v", e.tag, e.at, replayWait)
			}
			if h.tag != e.tag {
				t.Fatalf("request %d at %v: upstream %d received request %d instead", e.tag, e.at, h.up, h.tag)
			}
			c.held = h
			picks++
			if want := index[e.addr]; h.up != want {
				differ++
				if differ <= 3 {
					t.Errorf("request %d at %v: the bench picked server %d (%s), serve upstream %d", e.tag, e.at, want, e.addr, h.up)
				}
			}
		case "first":
			c := calls.get(e.tag)
			c.firstSent = true
			c.held.act <- actFirst
			wait(c.first, "request %d at %v: the client has not read its first chunk", e.tag, e.at)
		case "finish":
			c := calls.get(e.tag)
			var want int
			switch o := e.outcome; {
			case o.StreamError && c.firstSent:
				c.held.act <- actBreak
				want = http.StatusOK
			case o.StreamError:
				t.Fatalf("request %d at %v: a stream that broke before its first token is not replayable here", e.tag, e.at)
			case o.Status == http.StatusOK:
				c.held.act <- actFinish
				want = http.StatusOK
			default:
				// Refused by the server after the pick (a prompt it cannot hold):
				// answered at once.
				c.held.act <- actStatus(o.Status)
				want = o.Status
			}
			wait(c.done, "request %d at %v: the response has not ended", e.tag, e.at)
			wait(c.handled, "request %d at %v: ServeHTTP has not returned", e.tag, e.at)
			if c.err != nil {
				t.Fatalf("request %d: %v", e.tag, c.err)
			}
			if c.status != want {
				t.Errorf("request %d: the client got status %d, want %d", e.tag, c.status, want)
			}
			if want == http.StatusOK && !e.outcome.StreamError && !bytes.HasSuffix(c.body, []byte("data: [DONE]\n\n")) {
				t.Errorf("request %d: the stream ended without [DONE]: %q", e.tag, c.body)
			}
			calls.end(e.tag)
		}
	}
	if picks != len(tr) || differ > 0 {
		t.Fatalf("%d of %d picks differ (%d requests); %d request bodies were larger than the bench's BodyBytes", differ, picks, len(tr), larger)
	}
	if n := calls.open(); n > 0 {
		t.Fatalf("%d requests still open after the replay", n)
	}
	// The picks must have depended on state: one server taking everything
	// would agree trivially.
	per := map[string]int{}
	for _, e := range events {
		if e.kind == "route" {
			per[e.addr]++
		}
	}
	if len(per) < 4 {
		t.Fatalf("picks went to %d servers only: %v", len(per), per)
	}
}

// completionBody is a streaming completions request for the prompt text,
// padded to the size the bench routed with (bodyBytes) when it is shorter.
func completionBody(model string, prompt []byte, bodyBytes int64) []byte {
	m, _ := json.Marshal(model)
	p, _ := json.Marshal(string(prompt))
	b := fmt.Appendf(nil, `{"model":%s,"stream":true,"prompt":%s`, m, p)
	if pad := bodyBytes - int64(len(b)) - 1; pad > 0 {
		b = append(b, bytes.Repeat([]byte{' '}, int(pad))...)
	}
	return append(b, '}')
}

// tagHeader carries a request's index in the trace to the upstream and the
// front.
const tagHeader = "X-Samepicks-Tag"

// An upstream's actions on a held request.
const (
	actFirst  = "first"  // the headers and a first event
	actFinish = "finish" // the last event; the response ends
	actBreak  = "break"  // the connection breaks mid-stream
)

// actStatus answers an error status at once.
func actStatus(code int) string { return strconv.Itoa(code) }

// held is a request an upstream received and holds until told what to do.
type held struct {
	up, tag int
	act     chan string
}

// upstreams are loopback HTTP servers standing for the simulated model
// servers: each reports every request it receives and holds its response.
type upstreams struct {
	servers []*httptest.Server
	arrived chan *held
}

func newUpstreams(n int) *upstreams {
	u := &upstreams{arrived: make(chan *held)}
	for i := range n {
		u.servers = append(u.servers, httptest.NewServer(u.handler(i)))
	}
	return u
}

func (u *upstreams) addr(i int) string { return u.servers[i].Listener.Addr().String() }

func (u *upstreams) close() {
	for _, s := range u.servers {
		s.Close()
	}
}

func (u *upstreams) handler(i int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tag, err := strconv.Atoi(r.Header.Get(tagHeader))
		if err != nil {
			http.Error(w, "no "+tagHeader, http.StatusBadRequest)
			return
		}
		h := &held{up: i, tag: tag, act: make(chan string, 1)}
		select {
		case u.arrived <- h:
		case <-r.Context().Done():
			return
		}
		for {
			var a string
			select {
			case a = <-h.act:
			case <-r.Context().Done():
				return
			}
			switch a {
			case actFirst:
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				fmt.Fprintf(w, "data: {\"id\":\"cmpl-%d\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n", tag)
				_ = http.NewResponseController(w).Flush()
			case actFinish:
				fmt.Fprint(w, "data: [DONE]\n\n")
				return
			case actBreak:
				panic(http.ErrAbortHandler)
			default:
				code, _ := strconv.Atoi(a)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				fmt.Fprint(w, `{"error":{"message":"the prompt is too long","type":"invalid_request_error","code":400}}`)
				return
			}
		}
	}
}

// call is one request the replay sent to the gateway.
type call struct {
	held      *held
	firstSent bool
	failed    chan error    // the request failed before a response
	first     chan struct{} // closed when the client read the first event
	done      chan struct{} // closed when the client read the response to its end
	handled   chan struct{} // closed when ServeHTTP returned
	status    int
	body      []byte
	err       error
}

// calls are the requests in flight, by tag.
type calls struct {
	mu sync.Mutex
	m  map[int]*call
}

func newCalls() *calls { return &calls{m: map[int]*call{}} }

// start sends a request for tag and reads its response in the background.
func (cs *calls) start(ctx context.Context, client *http.Client, url string, tag int, body []byte) *call {
	c := &call{failed: make(chan error, 1), first: make(chan struct{}), done: make(chan struct{}), handled: make(chan struct{})}
	cs.mu.Lock()
	cs.m[tag] = c
	cs.mu.Unlock()
	go func() {
		defer close(c.done)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			c.err = err
			c.failed <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(tagHeader, strconv.Itoa(tag))
		resp, err := client.Do(req)
		if err != nil {
			c.err = err
			c.failed <- err
			return
		}
		defer func() { _ = resp.Body.Close() }()
		c.status = resp.StatusCode
		br := bufio.NewReader(resp.Body)
		if resp.StatusCode == http.StatusOK {
			// The first event: a data line and the blank line ending it.
			for _, want := range []string{"data: ", "\n"} {
				line, err := br.ReadString('\n')
				c.body = append(c.body, line...)
				if err != nil || !strings.HasPrefix(line, want) {
					c.err = fmt.Errorf("reading the first event: %q, %w", c.body, err)
					return
				}
			}
			close(c.first)
		}
		rest, err := io.ReadAll(br)
		c.body = append(c.body, rest...)
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("reading the response: %w", err)
		}
	}()
	return c
}

func (cs *calls) get(tag int) *call {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.m[tag]
}

// served notes that ServeHTTP returned for the request of a tag.
func (cs *calls) served(tag string) {
	n, err := strconv.Atoi(tag)
	if err != nil {
		return
	}
	if c := cs.get(n); c != nil {
		close(c.handled)
	}
}

func (cs *calls) end(tag int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.m, tag)
}

func (cs *calls) open() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.m)
}

// checkGoroutines fails the test if goroutines started since it counted before
// are still running a few seconds after everything closed.
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before the replay, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func addrsOf(events []simEvent) []string {
	seen := map[string]bool{}
	var out []string
	for i := range 64 {
		a := fmt.Sprintf("sim-%d:8000", i)
		for _, e := range events {
			if e.addr == a && !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}
