package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

const (
	usageJSON = `{"id":"ok","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`
	event     = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	midStream = "the upstream failed mid-response"
	done      = "data: [DONE]\n\n"
)

// upstreams are the targets' behaviours, by name.
var upstreams = map[string]http.HandlerFunc{
	"good": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "1")
		_, _ = io.WriteString(w, usageJSON)
	},
	"500": func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
	// closes: the connection ends before any headers.
	"closes": func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	},
	// dies: headers, then the connection ends before the first byte.
	"dies": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	},
	"mid-SSE": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	},
	"mid-JSON": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, `{"id":"x","choices":[`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	},
	// mid-big-JSON: a JSON body past the relay's buffer that breaks after 40 KB.
	"mid-big-JSON": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100000")
		_, _ = io.WriteString(w, `{"id":"x","pad":"`+strings.Repeat("x", 40000))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	},
	// streams: one event, then nothing until the request ends.
	"streams": func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // net/http sees the client go only past the body
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	},
	// pauses: an event, a pause, another, the end.
	"pauses": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
		w.(http.Flusher).Flush()
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(w, event+done)
	},
	// no-DONE: events, then a clean end without the terminator.
	"no-DONE": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
		w.(http.Flusher).Flush() // streamed, as model servers do: no Content-Length
		_, _ = io.WriteString(w, event)
	},
	// garbled: an event, one that is not JSON, more that never go out.
	"garbled": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: <html>Bad Gateway</html>\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		_, _ = io.WriteString(w, event+done)
	},
	// reads-slowly: the body a kilobyte at a time, then one event.
	"reads-slowly": func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1<<10)
		for {
			if _, err := r.Body.Read(buf); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, event)
	},
	// silent: an event stream's headers, then nothing until the request ends.
	"silent": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	},
	// hangs: no answer until the request ends.
	"hangs": func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	},
}

// bench is a front that forwards each request to the named upstreams with
// Forward, answering what nothing served with Result.Unserved, and records
// what happened.
type bench struct {
	front    *httptest.Server
	results  chan Result
	mu       sync.Mutex
	failures []*AttemptError
	acquired atomic.Int64
	released atomic.Int64
}

func newBench(t *testing.T, names []string, tune func(*Job)) *bench {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	var targets []Target
	for _, name := range names {
		s := httptest.NewServer(upstreams[name])
		t.Cleanup(s.Close)
		u, _ := url.Parse(s.URL)
		targets = append(targets, Target{Name: name, URL: u})
	}
	b := &bench{results: make(chan Result, 1)}
	b.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		j := &Job{Targets: targets, Transport: tr, Body: NewReplayBody(nil, r.Body, 64<<10), Request: r, RequestID: "rid",
			RetryStatus:      func(s int) bool { return s >= 500 },
			MidStreamMessage: midStream,
			Acquire: func(int) (func(), bool) {
				b.acquired.Add(1)
				return func() { b.released.Add(1) }, true
			},
			OnFailure: func(_ int, err *AttemptError) {
				b.mu.Lock()
				b.failures = append(b.failures, err)
				b.mu.Unlock()
			},
		}
		if tune != nil {
			tune(j)
		}
		res := Forward(w, j)
		b.results <- res
		if !res.Committed {
			if ref := res.Unserved("timed out", &Refusal{Status: http.StatusBadGateway, Message: "nothing served"}); ref != nil {
				ref.Write(w)
			}
		}
		if res.Abort {
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(b.front.Close)
	return b
}

// send posts a request and returns the status, the body as far as it came,
// and the error that cut it, if any.
func (b *bench) send(ctx context.Context) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestForward(t *testing.T) {
	type want struct {
		committed bool
		target    int
		status    int // the client's
		code      string
		failures  int
		abort     bool
		body      string // a part of what the client read
		cut       bool   // the client's read of the body failed
	}
	served := want{committed: true, target: 1, status: 200, code: "200", failures: 1, body: usageJSON}
	brokeSSE := want{committed: true, target: 0, status: 200, code: CodeStreamError, body: midStream}
	for _, tc := range []struct {
		name      string
		upstreams []string
		noWait    want // WaitFirstByte false
		wait      want // WaitFirstByte true
	}{
		{"answers 500, the next serves", []string{"500", "good"}, served, served},
		{"the last 500 is relayed", []string{"500"},
			want{committed: true, status: 500, code: "500", body: "boom"}, want{committed: true, status: 500, code: "500", body: "boom"}},
		{"closes before headers, the next serves", []string{"closes", "good"}, served, served},
		{"closes before headers, none left", []string{"closes"},
			want{target: 0, status: 502, failures: 1, body: "nothing served"}, want{target: 0, status: 502, failures: 1, body: "nothing served"}},
		{"headers then dies before the first byte", []string{"dies", "good"}, brokeSSE, served},
		{"breaks mid-SSE", []string{"mid-SSE", "good"},
			want{committed: true, status: 200, code: CodeStreamError, body: event + "data: {\"error\":{\"message\":\"" + midStream},
			want{committed: true, status: 200, code: CodeStreamError, body: event + "data: {\"error\":{\"message\":\"" + midStream}},
		// An event stream that ends without its terminator, or garbled, is
		// its target's failure, and the client is told.
		{"ends without its terminator", []string{"no-DONE", "good"},
			want{committed: true, status: 200, code: CodeStreamError, body: event + event + `data: {"error":{"message":"the model server's event stream ended without its terminator"`},
			want{committed: true, status: 200, code: CodeStreamError, body: event + event + `data: {"error":{"message":"the model server's event stream ended without its terminator"`}},
		{"sends an event that is not JSON", []string{"garbled", "good"},
			want{committed: true, status: 200, code: CodeStreamError, body: "</html>\n\n" + `data: {"error":{"message":"the model server's event stream sent an event that is not JSON"`},
			want{committed: true, status: 200, code: CodeStreamError, body: "</html>\n\n" + `data: {"error":{"message":"the model server's event stream sent an event that is not JSON"`}},
		// A JSON answer is read whole, as far as the buffer goes, before it
		// is committed: one that breaks within it is retried.
		{"breaks a JSON body mid-way", []string{"mid-JSON", "good"},
			want{committed: true, status: 200, code: CodeStreamError, abort: true, cut: true}, served},
		{"breaks a JSON body mid-way, none left", []string{"mid-JSON"},
			want{committed: true, status: 200, code: CodeStreamError, abort: true, cut: true},
			want{target: 0, status: 502, failures: 1, body: "nothing served"}},
		{"breaks a JSON body past the buffer", []string{"mid-big-JSON", "good"},
			want{committed: true, status: 200, code: CodeStreamError, abort: true, cut: true},
			want{committed: true, status: 200, code: CodeStreamError, abort: true, cut: true}},
	} {
		for _, wait := range []bool{false, true} {
			w := tc.noWait
			if wait {
				w = tc.wait
			}
			t.Run(fmt.Sprintf("%s/WaitFirstByte=%v", tc.name, wait), func(t *testing.T) {
				b := newBench(t, tc.upstreams, func(j *Job) { j.WaitFirstByte = wait })
				status, body, err := b.send(context.Background())
				res := <-b.results
				// A cut body may not even show its headers: they wait in the
				// front's buffer with the first bytes.
				if (err != nil) != w.cut || !w.cut && (status != w.status || !strings.Contains(body, w.body)) {
					t.Errorf("client got %d %q (err %v), want %d with %q, cut %v", status, body, err, w.status, w.body, w.cut)
				}
				if res.Committed != w.committed || res.Target != w.target || (w.committed && res.Status != w.status) ||
					res.Code != w.code || res.Abort != w.abort || res.ClientGone {
					t.Errorf("result %+v, want %+v", res, w)
				}
				if len(b.failures) != w.failures {
					t.Errorf("failures %v, want %d", b.failures, w.failures)
				}
				if a, r := b.acquired.Load(), b.released.Load(); a != r || a == 0 {
					t.Errorf("acquired %d, released %d", a, r)
				}
				if res.Code == "200" && (res.Usage != Usage{Prompt: 3, Completion: 2, Seen: true}) {
					t.Errorf("usage %+v", res.Usage)
				}
				if res.Code == CodeStreamError && res.Err == nil {
					t.Error("a broken answer without its error")
				}
			})
		}
	}
}

// TestForwardClientGone: a client that goes away mid-stream ends the relay
// with CodeClientGone and cancels the upstream request.
func TestForwardClientGone(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("WaitFirstByte=%v", wait), func(t *testing.T) {
			b := newBench(t, []string{"streams"}, func(j *Job) { j.WaitFirstByte = wait })
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.front.URL+"/v1/chat/completions", strings.NewReader(`{}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(event))
			if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != event {
				t.Fatalf("first event %q, %v", got, err)
			}
			cancel()
			_ = resp.Body.Close()
			select {
			case res := <-b.results:
				if !res.Committed || res.Code != CodeClientGone || !res.ClientGone || res.Usage.Events != 1 {
					t.Errorf("result %+v", res)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the relay went on after the client left")
			}
		})
	}
}

// TestForwardWatch: a target a Watch gives up on is failed over, timeouts
// make a 504, and a Watch that gives up after the answer came changes nothing.
func TestForwardWatch(t *testing.T) {
	slow := Timeout("no answer in 50ms")
	watch := func(after time.Duration) func(context.Context, int, func(error)) {
		return func(ctx context.Context, _ int, giveUp func(error)) {
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(after):
					giveUp(slow)
				}
			}()
		}
	}
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed over/WaitFirstByte=%v", wait), func(t *testing.T) {
			b := newBench(t, []string{"hangs", "good"}, func(j *Job) { j.WaitFirstByte, j.Watch = wait, watch(50*time.Millisecond) })
			status, body, _ := b.send(context.Background())
			res := <-b.results
			if status != 200 || body != usageJSON || res.Target != 1 || len(b.failures) != 1 || !errors.Is(b.failures[0], ErrTimeout) {
				t.Errorf("%d %q, result %+v, failures %v", status, body, res, b.failures)
			}
		})
	}
	t.Run("none in time", func(t *testing.T) {
		b := newBench(t, []string{"hangs", "hangs"}, func(j *Job) { j.Watch = watch(50 * time.Millisecond) })
		status, body, _ := b.send(context.Background())
		// The client is told which bound fired: the Watch's, not Ctx's.
		if res := <-b.results; status != 504 || !strings.Contains(body, "no endpoint answered in time: no answer in 50ms") || !res.TimedOut || res.Committed {
			t.Errorf("%d %q, result %+v", status, body, res)
		}
	})
	t.Run("too late to give up", func(t *testing.T) {
		// A watch that gives up once the answer came must not cut its relay.
		b := newBench(t, []string{"pauses"}, func(j *Job) {
			j.Watch = func(ctx context.Context, _ int, giveUp func(error)) {
				go func() {
					<-ctx.Done()
					giveUp(slow)
				}()
			}
		})
		status, body, err := b.send(context.Background())
		if res := <-b.results; status != 200 || body != event+event+done || err != nil || res.Code != "200" {
			t.Errorf("%d %q %v, result %+v", status, body, err, res)
		}
	})
}

// TestForwardAcquire: a target Acquire refuses is skipped, and every
// acquired one is released.
func TestForwardAcquire(t *testing.T) {
	var tried []int
	b := newBench(t, []string{"500", "good", "good"}, func(j *Job) {
		acquire := j.Acquire
		j.Acquire = func(i int) (func(), bool) {
			tried = append(tried, i)
			if i == 1 {
				return nil, false
			}
			return acquire(i)
		}
	})
	if status, _, _ := b.send(context.Background()); status != 200 {
		t.Fatalf("status %d", status)
	}
	if res := <-b.results; res.Target != 2 || fmt.Sprint(tried) != "[0 1 2]" || b.acquired.Load() != b.released.Load() {
		t.Errorf("target %d, tried %v, acquired %d released %d", res.Target, tried, b.acquired.Load(), b.released.Load())
	}
}

// TestForwardRequest: what goes upstream.
func TestForwardRequest(t *testing.T) {
	got := make(chan *http.Request, 1)
	bodies := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- string(b)
		w.Header().Set("X-Internal", "1")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL + "/base/")
	rec := httptest.NewRecorder()
	client := httptest.NewRequest(http.MethodPost, "/v1/completions?a=1", strings.NewReader("chunked?"))
	client.ContentLength = -1
	client.Header.Set("Authorization", "Bearer x")
	client.Header.Set("X-Kvgate-Explain", "1")
	res := Forward(rec, &Job{Targets: []Target{{Name: "up", URL: u}}, Body: WholeBody([]byte(`{"model":"m"}`)), Request: client, RequestID: "rid-7",
		Policy: HeaderPolicy{Tier: Tier1, StripCredentials: true}, Header: http.Header{"X-Gateway-Inference-Objective": {"batch"}},
		OnCommit: func(_ int, _ int, h http.Header) { h.Del("X-Internal"); h.Set("X-Kvgate-Member", "up") }})
	r := <-got
	if r.URL.Path != "/base/v1/completions" || r.URL.RawQuery != "a=1" || <-bodies != `{"model":"m"}` || r.ContentLength != 13 ||
		r.Header.Get("Authorization") != "" || r.Header.Get("X-Kvgate-Explain") != "" || r.Header.Get("X-Request-Id") != "rid-7" ||
		r.Header.Get("X-Gateway-Inference-Objective") != "batch" || r.Header.Get("X-Forwarded-For") == "" {
		t.Errorf("upstream got %s %v length %d", r.URL, r.Header, r.ContentLength)
	}
	if !res.Committed || rec.Code != 200 || rec.Header().Get("X-Internal") != "" || rec.Header().Get("X-Kvgate-Member") != "up" {
		t.Errorf("result %+v, client got %d %v", res, rec.Code, rec.Header())
	}
}

func TestUnserved(t *testing.T) {
	for _, c := range []struct {
		name   string
		res    Result
		status int // 0: nothing written
		msg    string
	}{
		{"client gone", Result{ClientGone: true}, 0, ""},
		{"too large while the client left", Result{ClientGone: true, bodyErr: &http.MaxBytesError{Limit: 9}}, 413, "request body exceeds 9 bytes"},
		{"stalled body", Result{ClientGone: true, TimedOut: true, bodyErr: os.ErrDeadlineExceeded}, 408, "the request body did not arrive in time"},
		// A body short of its length cancels the context too, yet the client
		// (which only closed its side) is owed an answer, not an empty 200.
		{"short body, client half-closed", Result{ClientGone: true, bodyErr: io.ErrUnexpectedEOF}, 400, "the request body could not be read to its end"},
		{"broken body, client gone", Result{ClientGone: true, bodyErr: syscall.ECONNRESET}, 0, ""},
		{"broken body", Result{bodyErr: io.ErrUnexpectedEOF}, 400, "the request body could not be read to its end"},
		{"timed out", Result{TimedOut: true}, 504, "late"},
		{"an attempt's bound timed out", Result{TimedOut: true, timeout: (&Job{FirstByteTimeout: 20 * time.Second}).firstByteError()}, 504,
			"no endpoint answered in time: no first event within 20s (firstByteTimeout)"},
		{"failed", Result{Err: errors.New("dial tcp 10.0.0.1: refused")}, 502, "failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := c.res.Unserved("late", &Refusal{Status: http.StatusBadGateway, Type: openai.TypeServer, Message: "failed"})
			if c.status == 0 {
				if ref != nil {
					t.Fatalf("refusal %+v for a client that went away", ref)
				}
				return
			}
			if ref == nil || ref.Status != c.status || ref.Message != c.msg {
				t.Fatalf("refusal %+v, want %d %q", ref, c.status, c.msg)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	why := errors.New("gave up")
	v := &verdict{}
	if err := v.answer(); err != nil || v.giveUp(why) {
		t.Fatal("the answer came first, yet the watcher could give up")
	}
	v = &verdict{}
	if !v.giveUp(why) || !errors.Is(v.answer(), why) {
		t.Fatal("the watcher gave up first, yet the answer was taken")
	}
}

// TestForwardTier1: what tier 1 sets — a replay buffer the body may outgrow,
// a route deadline — behaves as tier 1 does.
func TestForwardTier1(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("a body past the retry buffer is not sent again/WaitFirstByte=%v", wait), func(t *testing.T) {
			b := newBench(t, []string{"500", "good"}, func(j *Job) {
				j.WaitFirstByte, j.Body = wait, NewReplayBody(nil, j.Request.Body, 5)
			})
			status, body, _ := b.send(context.Background())
			if res := <-b.results; status != 500 || !strings.Contains(body, "boom") || res.Target != 0 || len(b.failures) != 0 {
				t.Errorf("%d %q, result %+v, failures %v", status, body, res, b.failures)
			}
		})
		t.Run(fmt.Sprintf("the route deadline mid-stream/WaitFirstByte=%v", wait), func(t *testing.T) {
			b := newBench(t, []string{"streams"}, func(j *Job) {
				ctx, cancel := context.WithTimeout(j.Request.Context(), 200*time.Millisecond)
				context.AfterFunc(j.Request.Context(), cancel) // released with the request
				j.WaitFirstByte, j.Ctx = wait, ctx
			})
			status, body, err := b.send(context.Background())
			res := <-b.results
			if status != 200 || err != nil || !strings.Contains(body, event+`data: {"error":{"message":"`+midStreamTimeout) || !strings.Contains(body, `"code":504`) {
				t.Errorf("client got %d %q %v", status, body, err)
			}
			if res.Code != CodeStreamError || !res.TimedOut || res.ClientGone || res.Abort {
				t.Errorf("result %+v", res)
			}
		})
	}
	t.Run("the route deadline before an answer", func(t *testing.T) {
		b := newBench(t, []string{"hangs", "good"}, func(j *Job) {
			ctx, cancel := context.WithTimeout(j.Request.Context(), 100*time.Millisecond)
			context.AfterFunc(j.Request.Context(), cancel) // released with the request
			j.Ctx = ctx
		})
		status, body, _ := b.send(context.Background())
		if res := <-b.results; status != 504 || !strings.Contains(body, "timed out") || !res.TimedOut || res.Committed || len(b.failures) != 0 {
			t.Errorf("%d %q, result %+v, failures %v", status, body, res, b.failures)
		}
	})
}

// TestForwardBoundNamed: a stall ends with a message that names the bound
// that fired, with its value, before the answer and after it started.
func TestForwardBoundNamed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream string
		tune     func(*Job)
		status   int
		want     string
	}{
		{"first byte", "silent", func(j *Job) { j.WaitFirstByte, j.FirstByteTimeout = true, 50*time.Millisecond }, 504,
			"no endpoint answered in time: no first event within 50ms (firstByteTimeout)"},
		{"stream idle", "streams", func(j *Job) { j.IdleTimeout = 50 * time.Millisecond }, 200,
			`data: {"error":{"message":"the model server sent nothing for 50ms (streamIdleTimeout)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t, []string{tc.upstream}, tc.tune)
			status, body, _ := b.send(context.Background())
			<-b.results
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("client got %d %q, want %d with %q", status, body, tc.status, tc.want)
			}
		})
	}
}
