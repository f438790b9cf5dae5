package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/logtest"
	"github.com/kvgate/kvgate/internal/testenv"
)

// The process fault suite: real `kvgate sim` processes — killed (SIGKILL),
// frozen (SIGSTOP) or told to misbehave (PUT /admin/faults) — behind an
// in-process gateway with the default timeouts, the configuration a pod runs
// with when nobody tuned it. Every request's outcome is read off the wire; a
// stream that ends without [DONE] or an error event (a silent loss) or one the
// client had to give up on (a hang) fails its case.

// procMaxTokens makes a stream last about 0.4 s on a simulated H100: long enough
// to be caught mid-way by a fault, short enough for bursts of a hundred.
const procMaxTokens = 48

// lastLines is text's last n lines.
func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// linesWith is text's lines that contain s.
func linesWith(text, s string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// simProc is a running `kvgate sim` process.
type simProc struct {
	cmd  *exec.Cmd
	addr string
	log  *logtest.Buffer // its stderr: the simulator's warnings
}

// startSimProc runs `kvgate sim` for llama on a free loopback port until the
// test ends; cleanup thaws it (SIGCONT) before killing it.
func startSimProc(t *testing.T) *simProc {
	t.Helper()
	cmd := exec.Command(testenv.Kvgate(t), "sim", "--listen", "127.0.0.1:0", "--model", llama, "--gpu", "h100", "--model-size", "8b", "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &simProc{cmd: cmd, log: &logtest.Buffer{}}
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if l := lastLines(p.log.String(), 30); t.Failed() && l != "" {
			t.Logf("sim %s stderr (last lines):\n%s", p.addr, l)
		}
	})
	// It prints "kvgate sim: sim serving on http://ADDR (...)" once it listens.
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, after, ok := strings.Cut(sc.Text(), " on http://"); ok && len(found) == 0 {
				found <- strings.Fields(after)[0]
			}
		}
	}()
	select {
	case p.addr = <-found:
	case <-time.After(30 * time.Second):
		t.Fatalf("kvgate sim did not say where it serves within 30s; stderr:\n%s", lastLines(p.log.String(), 30))
	}
	return p
}

func (p *simProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v to sim %s: %v", sig, p.addr, err)
	}
}

// The outcomes of a request as the client sees them on the wire.
const (
	kindOK         = "ok"          // 200, content, and data: [DONE]
	kindErrorEvent = "error-event" // 200, then an SSE data: {"error":...} event
	kindCut        = "cut"         // the body ended without [DONE] or an error event: a silent loss
	kindHang       = "hang"        // the client's timeout fired first
	kindEmpty      = "empty"       // [DONE] without any content
	// and "status N": not 200, with an OpenAI error body
)

// outcome is one request's end, read off the wire.
type outcome struct {
	id         string // its x-request-id (the gateway logs it)
	kind       string
	status     int
	endpoint   string // x-kvgate-endpoint: the pod that served it
	retryAfter string
	detail     string // the error's message, or what the read saw
	bad        string // a body that is not what the API promises
	leak       string // a line of the body naming gateway internals
	events     int
	start, end time.Time
}

func (o outcome) took() time.Duration { return o.end.Sub(o.start) }

// wireClient sends streaming chat requests with a raw HTTP client and reads
// their event streams itself: the SDK's stream ends the same way whether the
// body ended with data: [DONE] or was cut short, so it cannot tell an answer
// from a silent loss.
type wireClient struct {
	base, prefix string
	client       *http.Client
	timeout      time.Duration // each request's; past it the request is a hang
	n            atomic.Int64
}

func (c *wireClient) stream() (o outcome) {
	i := c.n.Add(1)
	o = outcome{id: fmt.Sprintf("%s-%d", c.prefix, i), start: time.Now()}
	defer func() { o.end = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	// A different prompt each, so that prefix affinity does not pick the pod.
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"question %d of %s"}],"max_tokens":%d,"ignore_eos":true,"stream":true}`, llama, i, c.prefix, procMaxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", o.id)
	resp, err := c.client.Do(req)
	if err != nil {
		o.kind, o.detail = kindCut, "no response: "+err.Error()
		if ctx.Err() != nil {
			o.kind = kindHang
		}
		return o
	}
	defer resp.Body.Close()
	o.status, o.endpoint, o.retryAfter = resp.StatusCode, resp.Header.Get("X-Kvgate-Endpoint"), resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		o.kind, o.leak = fmt.Sprintf("status %d", resp.StatusCode), leak(string(raw))
		var e apiError
		switch {
		case err != nil && ctx.Err() != nil:
			o.kind, o.detail = kindHang, fmt.Sprintf("status %d, reading its body: %v", resp.StatusCode, err)
		case err != nil:
			o.kind, o.detail = kindCut, fmt.Sprintf("status %d, reading its body: %v", resp.StatusCode, err)
		case json.Unmarshal(raw, &e) != nil || e.Error.Message == "":
			o.bad = fmt.Sprintf("status %d with a body that is not an OpenAI error: %q", resp.StatusCode, raw)
		default:
			o.detail = e.Error.Message
		}
		return o
	}
	rd := bufio.NewReader(resp.Body)
	content, done, errEvent := 0, false, ""
	for {
		line, err := rd.ReadString('\n')
		if l := strings.TrimSpace(line); l != "" {
			if s := leak(l); s != "" && o.leak == "" {
				o.leak = s
			}
			if data, ok := strings.CutPrefix(l, "data: "); ok {
				o.events++
				var ev struct {
					Error *struct {
						Message string `json:"message"`
					} `json:"error"`
					Choices []struct {
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
				}
				switch {
				case data == "[DONE]":
					done = true
				case json.Unmarshal([]byte(data), &ev) != nil:
					o.bad = fmt.Sprintf("an event that is not JSON: %q", data)
				case ev.Error != nil:
					errEvent = ev.Error.Message
					if errEvent == "" {
						o.bad = fmt.Sprintf("an error event without a message: %q", data)
					}
				default:
					for _, ch := range ev.Choices {
						content += len(ch.Delta.Content)
					}
				}
			}
		}
		if err == nil {
			continue
		}
		switch {
		case ctx.Err() != nil:
			o.kind, o.detail = kindHang, fmt.Sprintf("after %d events (error event %q): %v", o.events, errEvent, err)
		case errEvent != "":
			o.kind, o.detail = kindErrorEvent, errEvent
		case done && content > 0:
			o.kind = kindOK
		case done:
			o.kind = kindEmpty
		default:
			o.kind, o.detail = kindCut, fmt.Sprintf("after %d events: %v", o.events, err)
		}
		return o
	}
}

// leak returns s if it names what a client has no business seeing: an
// upstream's address or Go's dial errors.
func leak(s string) string {
	if strings.Contains(s, "127.0.0.1") || strings.Contains(s, "dial tcp") {
		return s
	}
	return ""
}

// burst sends n requests, conc at a time, in order; before handing out the i-th
// (from 0) it calls before(i), if set.
func (c *wireClient) burst(n, conc int, before func(i int)) []outcome {
	out := make([]outcome, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := range next {
				out[i] = c.stream()
			}
		})
	}
	for i := range n {
		if before != nil {
			before(i)
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// loop runs conc clients, each sending one request after another, until stop
// is called; stop returns every outcome once the last request ended. Calling
// it again returns the same.
func (c *wireClient) loop(conc int) (stop func() []outcome) {
	var (
		mu   sync.Mutex
		out  []outcome
		wg   sync.WaitGroup
		quit = make(chan struct{})
		once sync.Once
	)
	for range conc {
		wg.Go(func() {
			for {
				select {
				case <-quit:
					return
				default:
				}
				o := c.stream()
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		})
	}
	return func() []outcome {
		once.Do(func() { close(quit); wg.Wait() })
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

// endpointShare counts the requests each pod served (by x-kvgate-endpoint;
// "" for those no pod answered).
func endpointShare(rs []outcome) map[string]int {
	m := map[string]int{}
	for _, o := range rs {
		m[o.endpoint]++
	}
	return m
}

// procEnv is one case's pods, gateway and client.
type procEnv struct {
	sims []*simProc
	g    *fixture
	c    *wireClient
	t0   time.Time       // when the case's load began
	glog *logtest.Buffer // the gateway's warnings
}

func (e *procEnv) addrs() []string {
	a := make([]string, len(e.sims))
	for i, s := range e.sims {
		a[i] = s.addr
	}
	return a
}

// busiest is the pod with the most requests in flight through the gateway.
func (e *procEnv) busiest() *simProc {
	best, most := e.sims[0], int64(-1)
	for _, v := range e.g.FleetView()[0].Endpoints {
		for _, s := range e.sims {
			if s.addr == v.Address && v.InFlight > most {
				best, most = s, v.InFlight
			}
		}
	}
	return best
}

// fleetState is how the fleet reads each pod now, for failure messages.
func (e *procEnv) fleetState() string {
	var parts []string
	for _, s := range e.g.Snapshot(e.addrs()) {
		parts = append(parts, fmt.Sprintf("%s healthy=%v stale=%v failures=%d age=%v", s.Address, s.Healthy, s.Stale, s.Failures, s.Age.Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}

func (e *procEnv) describe(o outcome) string {
	return fmt.Sprintf("request %s: %s via %q, started at +%v, took %v: %s%s", o.id, o.kind, o.endpoint,
		o.start.Sub(e.t0).Round(time.Millisecond), o.took().Round(time.Millisecond), o.detail, o.bad)
}

// expectKinds fails the test for each outcome whose kind is not one of kinds
// (cut and hang are checkWire's).
func (e *procEnv) expectKinds(t *testing.T, rs []outcome, kinds ...string) {
	t.Helper()
	for _, o := range rs {
		if o.kind != kindCut && o.kind != kindHang && !slices.Contains(kinds, o.kind) {
			t.Errorf("want %s: %s", strings.Join(kinds, " or "), e.describe(o))
		}
	}
}

// checkWire fails the test for what no case allows: a cut, a hang, a body that
// is not the API's, one that shows internals.
func (e *procEnv) checkWire(t *testing.T, rs []outcome) {
	t.Helper()
	for _, o := range rs {
		switch {
		case o.kind == kindCut:
			t.Errorf("SILENT LOSS: %s; the gateway logged:\n%s", e.describe(o), linesWith(e.glog.String(), "request_id="+o.id+" "))
		case o.kind == kindHang:
			t.Errorf("HANG: %s; the gateway logged:\n%s", e.describe(o), linesWith(e.glog.String(), "request_id="+o.id+" "))
		case o.bad != "":
			t.Errorf("bad body: %s", e.describe(o))
		}
		if o.leak != "" {
			t.Errorf("request %s shows internals to its client: %q", o.id, o.leak)
		}
	}
}

// summary is a case's counts on one line.
func summary(name string, rs []outcome, took time.Duration) string {
	return fmt.Sprintf("%s: %s, in %v", name, counts(rs), took.Round(100*time.Millisecond))
}

// counts says how many requests ended each way.
func counts(rs []outcome) string {
	var ok, ev, st, cut, hang, other int
	statuses := map[string]int{}
	for _, o := range rs {
		switch {
		case o.kind == kindOK:
			ok++
		case o.kind == kindErrorEvent:
			ev++
		case strings.HasPrefix(o.kind, "status "):
			st++
			statuses[strings.TrimPrefix(o.kind, "status ")]++
		case o.kind == kindCut:
			cut++
		case o.kind == kindHang:
			hang++
		default:
			other++
		}
	}
	s := fmt.Sprintf("%d requests: %d ok, %d error-event, %d status", len(rs), ok, ev, st)
	if st > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(statuses)) {
			parts = append(parts, fmt.Sprintf("%s×%d", k, statuses[k]))
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	s += fmt.Sprintf(", %d cut, %d hang", cut, hang)
	if other > 0 {
		s += fmt.Sprintf(", %d other", other)
	}
	return s
}

// TestProcessFaults: real simulator processes killed, frozen and cutting
// streams behind a gateway with the default timeouts. Whatever happens to a
// pod, every request ends on the wire with an answer, an error event or an
// error status — never a bare EOF, never a wait past what the defaults allow.
// The cases run in parallel: the suite takes about as long as the freeze.
func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs simulator processes for over a minute")
	}
	testenv.Kvgate(t) // once, before the cases start their clocks
	for _, tc := range []struct {
		name string
		pods int
		// Each request's client timeout; past it the request is a hang. Over
		// freezeFor where a pod freezes.
		timeout time.Duration
		run     func(t *testing.T, e *procEnv) []outcome
	}{
		{"pod killed mid-burst", 3, 30 * time.Second, podKilledMidBurst},
		{"pod frozen past streamIdleTimeout", 3, 90 * time.Second, podFrozen},
		{"whole pool frozen", 2, 90 * time.Second, poolFrozen},
		{"pod cutting 30% of streams", 3, 30 * time.Second, podCuttingStreams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			glog := &logtest.Buffer{}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway warnings (last lines):\n%s", lastLines(glog.String(), 30))
				}
			})
			e := &procEnv{glog: glog}
			for range tc.pods {
				e.sims = append(e.sims, startSimProc(t))
			}
			// The defaults: no timeout, scrape or outlier setting.
			cfg := gatewayConfig(scheduler("p", llama, e.addrs()...))
			var base string
			e.g, base = startGateway(t, cfg, func(o *setup) {
				o.Logger = slog.New(slog.NewTextHandler(glog, &slog.HandlerOptions{Level: slog.LevelWarn}))
			})
			waitScraped(t, e.g, e.addrs()...)
			tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			t.Cleanup(tr.CloseIdleConnections)
			e.c = &wireClient{base: base, prefix: strings.ReplaceAll(t.Name(), "/", "."), client: &http.Client{Transport: tr}, timeout: tc.timeout}
			e.t0 = time.Now()
			rs := tc.run(t, e)
			e.checkWire(t, rs)
			t.Log(summary(tc.name, rs, time.Since(e.t0)))
		})
	}
}

// podKilledMidBurst: a pod SIGKILLed while a burst streams through it. Its
// streams end with an error event; requests waiting for its first byte and
// those sent after the kill go elsewhere.
func podKilledMidBurst(t *testing.T, e *procEnv) []outcome {
	var (
		victim   *simProc
		killedAt time.Time
		inFlight int64
	)
	rs := e.c.burst(120, 12, func(i int) {
		if i == 60 {
			victim = e.busiest()
			for _, v := range e.g.FleetView()[0].Endpoints {
				if v.Address == victim.addr {
					inFlight = v.InFlight
				}
			}
			victim.signal(t, syscall.SIGKILL)
			killedAt = time.Now()
		}
	})
	e.expectKinds(t, rs, kindOK, kindErrorEvent, "status 503")
	after := 0
	for _, o := range rs {
		if o.kind == kindErrorEvent && o.endpoint != victim.addr {
			t.Errorf("a stream broke on a pod nobody killed: %s", e.describe(o))
		}
		if o.start.After(killedAt) {
			after++
			if o.kind != kindOK {
				t.Errorf("sent after the kill: %s", e.describe(o))
			}
		}
	}
	t.Logf("killed %s at +%v with %d requests in flight on it; %d requests sent after the kill, %v retried (connect), share %v",
		victim.addr, killedAt.Sub(e.t0).Round(time.Millisecond), inFlight, after,
		counter(t, e.g, "kvgate_retries_total", "reason", "connect"), endpointShare(rs))
	return rs
}

// freezeFor is how long podFrozen keeps its pod stopped: the default
// streamIdleTimeout and a margin, so that the idle bound, not the thaw, ends
// the streams caught on it.
const freezeFor = v1alpha1.DefaultStreamIdleTimeout + 3*time.Second

// podFrozen: one pod SIGSTOPped for freezeFor under steady load. Its streams
// end with an error event within streamIdleTimeout; requests waiting for its
// first byte are retried elsewhere once the fleet reads it stale; thawed, it
// serves again.
func podFrozen(t *testing.T, e *procEnv) []outcome {
	stop := e.c.loop(8)
	defer stop()
	time.Sleep(3 * time.Second)
	victim := e.busiest()
	victim.signal(t, syscall.SIGSTOP)
	frozenAt := time.Now()
	noticed := time.Duration(-1)
	for time.Since(frozenAt) < 10*time.Second {
		if s := e.g.Snapshot([]string{victim.addr})[0]; !s.Healthy || s.Stale {
			noticed = time.Since(frozenAt)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Until(frozenAt.Add(freezeFor)))
	victim.signal(t, syscall.SIGCONT)
	thawedAt := time.Now()
	waitScraped(t, e.g, victim.addr)
	readyAt := time.Now()
	time.Sleep(5 * time.Second)
	rs := stop()

	e.expectKinds(t, rs, kindOK, kindErrorEvent)
	idle := v1alpha1.DefaultStreamIdleTimeout
	caught, events, again := 0, 0, 0
	for _, o := range rs {
		// A stream mid-way on the pod when it froze, still open long after.
		if o.endpoint == victim.addr && o.start.Before(frozenAt) && o.end.After(frozenAt.Add(idle/2)) {
			caught++
			if late := o.end.Sub(frozenAt); late > idle+5*time.Second {
				t.Errorf("a stream caught by the freeze ended %v after it (streamIdleTimeout %v): %s", late.Round(time.Millisecond), idle, e.describe(o))
			}
			if o.kind == kindErrorEvent && !strings.Contains(o.detail, "sent nothing for") {
				t.Errorf("a stream caught by the freeze ended with another error: %s", e.describe(o))
			}
		} else if o.kind == kindErrorEvent {
			t.Errorf("an error event not from a stream caught by the freeze: %s", e.describe(o))
		}
		switch {
		case o.kind == kindErrorEvent:
			events++
		case o.kind == kindOK && o.took() > 15*time.Second:
			// Only a request left waiting on the frozen pod takes this long.
			t.Errorf("answered, but only after the thaw: %s", e.describe(o))
		case o.kind == kindOK && o.endpoint == victim.addr && o.start.After(readyAt):
			again++
		}
	}
	var ejected float64
	for _, v := range e.g.FleetView()[0].Endpoints {
		if v.Address == victim.addr {
			ejected = v.EjectedForMs
		}
	}
	t.Logf("froze %s at +%v for %v; the fleet read it down after %v; %d streams caught by the freeze, %d ended with an error event; %v requests retried (unhealthy); thawed at +%v, read healthy %v later; then it served %d of the last 5s's requests (ejected for %.0f ms more); share %v",
		victim.addr, frozenAt.Sub(e.t0).Round(time.Millisecond), freezeFor, noticed.Round(time.Millisecond), caught, events,
		counter(t, e.g, "kvgate_retries_total", "reason", "unhealthy"), thawedAt.Sub(e.t0).Round(time.Millisecond),
		readyAt.Sub(thawedAt).Round(time.Millisecond), again, ejected, endpointShare(rs))
	if noticed < 0 {
		t.Errorf("the fleet still read %s healthy 10s into its freeze", victim.addr)
	}
	if again == 0 {
		t.Errorf("the thawed pod %s served none of the requests sent in the 5s after the fleet read it healthy (outlier detection: ejected for %.0f ms more)", victim.addr, ejected)
	}
	return rs
}

// poolFrozen: every pod SIGSTOPped. Once the fleet reads them down, each new
// request is refused at once with 503 and Retry-After; the streams caught by
// the freeze end with an error event (or, still waiting for their first byte,
// with 503); thawed, the pool serves again.
func poolFrozen(t *testing.T, e *procEnv) []outcome {
	stop := e.c.loop(8)
	defer stop()
	time.Sleep(2 * time.Second)
	// The clients stop sending first: the requests running now are those the
	// freeze catches.
	done := make(chan []outcome, 1)
	go func() { done <- stop() }()
	for _, s := range e.sims {
		s.signal(t, syscall.SIGSTOP)
	}
	frozenAt := time.Now()
	for len(e.g.Unready()) == 0 {
		if time.Since(frozenAt) > 15*time.Second {
			t.Fatal("the fleet never read the frozen pool down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	noticed := time.Since(frozenAt)
	// The probes should be refused within 2s: one unanswered after 10s is a
	// hang, and the case need not wait out the default timeouts to say so.
	pc := &wireClient{base: e.c.base, prefix: e.c.prefix + ".probe", client: e.c.client, timeout: 10 * time.Second}
	var probes []outcome
	for range 10 {
		fleet := e.fleetState()
		o := pc.stream()
		probes = append(probes, o)
		if o.kind != "status 503" || o.retryAfter == "" || o.took() > 2*time.Second {
			t.Errorf("a request to the frozen pool: want 503 with Retry-After within 2s, got Retry-After %q: %s; the fleet read at its start: %s", o.retryAfter, e.describe(o), fleet)
		}
	}
	before := <-done // each ends by its client timeout at the latest
	e.expectKinds(t, before, kindOK, kindErrorEvent, "status 503")
	var caught []outcome // those running when the pool froze
	late := time.Duration(0)
	for _, o := range before {
		if o.end.After(frozenAt) {
			caught = append(caught, o)
			late = max(late, o.end.Sub(frozenAt))
		}
	}
	if idle := v1alpha1.DefaultStreamIdleTimeout; late > idle+5*time.Second {
		t.Errorf("the last request caught by the freeze ended %v after it (streamIdleTimeout %v)", late, idle)
	}
	for _, s := range e.sims {
		s.signal(t, syscall.SIGCONT)
	}
	thawedAt := time.Now()
	waitScraped(t, e.g, e.addrs()...)
	after := e.c.burst(8, 4, nil)
	e.expectKinds(t, after, kindOK)
	t.Logf("froze both pods at +%v; the pool read down after %v; then %s, the slowest %v; running at the freeze: %s (the last %v after it); thawed, read healthy after %v: %s",
		frozenAt.Sub(e.t0).Round(time.Millisecond), noticed.Round(time.Millisecond), counts(probes), slowest(probes),
		counts(caught), late.Round(time.Millisecond), time.Since(thawedAt).Round(time.Millisecond), counts(after))
	return slices.Concat(before, probes, after)
}

func slowest(rs []outcome) time.Duration {
	var d time.Duration
	for _, o := range rs {
		d = max(d, o.took())
	}
	return d.Round(time.Millisecond)
}

// podCuttingStreams: a pod that drops the connection of 30% of its streams
// after their first token. Each such stream reaches its client as an error
// event, never as a bare EOF.
func podCuttingStreams(t *testing.T, e *procEnv) []outcome {
	faulty := e.sims[0]
	req, _ := http.NewRequest(http.MethodPut, "http://"+faulty.addr+"/admin/faults", strings.NewReader(`{"closeMidStreamRate":0.3}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /admin/faults: %d %s", resp.StatusCode, raw)
	}
	rs := e.c.burst(150, 12, nil)
	e.expectKinds(t, rs, kindOK, kindErrorEvent)
	cut := 0
	for _, o := range rs {
		if o.kind == kindErrorEvent {
			cut++
			if o.endpoint != faulty.addr {
				t.Errorf("a stream broke on a healthy pod: %s", e.describe(o))
			}
		}
	}
	if cut == 0 {
		t.Error("no stream was cut: the fault did not fire")
	}
	// The errorRate scorer passes over the pod whose streams break: its
	// share stays below a fair third (before the scorer it drew 1.5× its
	// peers').
	share := endpointShare(rs)
	if 3*share[faulty.addr] >= len(rs) {
		t.Errorf("the cutting pod served %d of %d requests, not less than a fair third", share[faulty.addr], len(rs))
	}
	var parts []string
	for _, s := range e.sims {
		label := s.addr
		if s == faulty {
			label += " (cutting)"
		}
		parts = append(parts, fmt.Sprintf("%s %d (%.0f%%)", label, share[s.addr], 100*float64(share[s.addr])/float64(len(rs))))
	}
	t.Logf("%d streams cut by %s, each ended with an error event; share by pod: %s", cut, faulty.addr, strings.Join(parts, ", "))
	return rs
}
