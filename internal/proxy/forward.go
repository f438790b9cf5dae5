package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// copyPool holds the relay's buffers: one a request, on the hot path.
var copyPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ErrTimeout marks a Watch verdict that the target was too slow rather than
// broken: a request that found no target in time is answered 504, not 502.
var ErrTimeout = errors.New("timed out")

// Timeout is an error, with its own text, that is ErrTimeout (errors.Is).
type Timeout string

func (e Timeout) Error() string { return string(e) }

// Is makes every Timeout an ErrTimeout.
func (Timeout) Is(target error) bool { return target == ErrTimeout }

// Target is one upstream a request may go to.
type Target struct {
	// Name labels the target in errors (and, for the caller, logs and metrics).
	Name string
	// URL is the target's base: scheme, host and any path prefix; the
	// client's path and query are appended.
	URL *url.URL
}

// Job is one client request to pass on: to Targets in turn, until one answers
// with a response that is relayed to the client. Tier 1 and tier 2 differ only
// in the fields they set.
type Job struct {
	// Targets in the order they are tried.
	Targets []Target
	// Transport reaches the targets (nil: http.DefaultTransport).
	Transport http.RoundTripper
	// Body is what every attempt sends; its length is the client's
	// ContentLength unless it is held whole.
	Body *ReplayBody
	// Request is the client's: its path, query, headers and RemoteAddr go
	// upstream, and its context says whether the client is still there.
	Request *http.Request
	// Ctx bounds the attempts and the relay (tier 1: the route's deadline);
	// nil: the client's context.
	Ctx       context.Context
	RequestID string
	// Policy says which of the client's headers stay here.
	Policy HeaderPolicy
	// Header is set on every upstream request after the client's headers.
	Header http.Header
	// RetryStatus says whether a target that answered status is given up on
	// for the next one, while the body can be sent again; the last target's
	// answer is relayed whatever its status. nil: none is.
	RetryStatus func(status int) bool
	// WaitFirstByte holds the response's headers back until its first bytes
	// arrived (or it ended empty): a target that dies before them is given
	// up on like one that never answered. Responses with a RetryStatus go out
	// at once.
	WaitFirstByte bool
	// MidStreamMessage is the error event that ends an event stream that broke
	// (once Ctx's deadline passed: midStreamTimeout, with 504).
	MidStreamMessage string
	// FirstByteTimeout, with WaitFirstByte, bounds the wait from an event
	// stream's headers to its first bytes: a target that misses it is given up
	// on (ErrTimeout) for the next. 0: none.
	FirstByteTimeout time.Duration
	// IdleTimeout ends an event stream that sent nothing for this long once
	// relayed (with an error event, 504); 0: never.
	IdleTimeout time.Duration
	// WriteTimeout ends the relay of an event stream when the client has not
	// taken a write for about this long (counted as the client gone); 0: never.
	WriteTimeout time.Duration

	// Acquire says whether target i may be tried now and returns what to call
	// when its attempt is over (nil: nothing); nil Acquire: every target may.
	// It is called for target 0 whenever there is one, so that a caller that
	// reserved target 0 before Forward may release it here (tier 2); one that
	// keeps its own accounting releases it itself, also on a panic (tier 1).
	Acquire func(i int) (release func(), ok bool)
	// Watch, when set, is called as each attempt starts and must not block: it
	// arranges its own checks (a goroutine, a shared watcher) until ctx ends
	// (the answer came, or the attempt is over), and may call giveUp first:
	// the attempt is then cancelled and failed with why, unless its answer
	// came first.
	Watch func(ctx context.Context, i int, giveUp func(why error))
	// OnFailure is told of an attempt given up on for the next target: not
	// one the client or Ctx ended.
	OnFailure func(i int, err *AttemptError)
	// OnCommit runs once target i's answer is chosen, with the response
	// headers about to go out (copied, hop-by-hop ones removed): a caller
	// adds or removes its own.
	OnCommit func(i int, status int, h http.Header)
	// OnFirstByte runs when the answer's first bytes are read, before they
	// are written.
	OnFirstByte func(i int, sse bool)
	// OnSent runs once the request to target i was written whole, its body's
	// last byte included (httptrace's WroteRequest): the moment the target
	// has all of it, from which its time to first token is its own. It may
	// run on the transport's goroutine, concurrently with the other hooks of
	// attempt i, but never once attempt i is over (the next target tried, or
	// Forward returned); it does not run for a request whose write failed.
	OnSent func(i int)
	// Replace, when set, may return the caller's own error to send instead of
	// the answer chosen (a model server's 5xx, whose body may carry its
	// stack, addresses or a sidecar's wording); nil relays it. The answer's
	// first bytes go to Result.Replaced, for the log.
	Replace func(status int) *Refusal
	// OnAttempt, when set, runs with the request to target i just before it
	// goes out: a caller may add headers (a trace's traceparent).
	OnAttempt func(i int, req *http.Request)
}

// replacedLog bounds the head of a replaced answer kept for the log.
const replacedLog = 2 << 10

// midStreamTimeout ends an event stream cut by Ctx's deadline (tier 1: the
// scheduler's routeTimeout, which the message names).
const midStreamTimeout = "route timeout exceeded mid-response (routeTimeout)"

// ErrShutdown is the cause with which a server that stops ends the requests
// still running at the end of its drain: they get an explicit error (503 before
// the answer started, an SSE error event after), not the silence of a cut.
var ErrShutdown = errors.New("the gateway is shutting down")

// shutdown says whether the client's request was ended by the server stopping.
func shutdown(r *http.Request) bool { return errors.Is(context.Cause(r.Context()), ErrShutdown) }

// firstByteError is a target that sent an event stream's headers and then
// nothing within FirstByteTimeout: it names the bound, which the client reads
// when no target answered in time.
func (j *Job) firstByteError() Timeout {
	return Timeout(fmt.Sprintf("no first event within %v (firstByteTimeout)", j.FirstByteTimeout))
}

// An event stream that ended cleanly yet is not whole: counted as its
// target's failure (CodeStreamError) and ended with an error event.
var (
	errNoTerminator   = errors.New("event stream ended without its terminator")
	errMalformedEvent = errors.New("event stream sent an event that is not JSON")
)

// AttemptError is why an attempt at a target failed: the transport's error
// (or Watch's reason), or the status the target answered.
type AttemptError struct {
	Target string
	Status int // 0 when Err says why
	Err    error
}

func (e *AttemptError) Error() string {
	if e.Err != nil {
		return e.Target + ": " + e.Err.Error()
	}
	return e.Target + " answered " + strconv.Itoa(e.Status) + " " + http.StatusText(e.Status)
}

func (e *AttemptError) Unwrap() error { return e.Err }

// Usage is what a relayed answer reported using.
type Usage struct {
	Prompt, Completion int64
	// Seen: the answer carried a usage object.
	Seen bool
	// Events counts its server-sent events with data, but [DONE].
	Events int64
}

// Result is how a Job ended.
type Result struct {
	// Committed: a target's answer (its headers at least) went to the client.
	Committed bool
	// Target is the committed target, else the last one tried (-1: none).
	Target int
	Status int
	SSE    bool
	// Code is the outcome label of a committed answer: Code(Status),
	// CodeClientGone or CodeStreamError.
	Code  string
	Usage Usage
	// Err is the last attempt's failure (not committed) or the error that
	// broke the answer mid-way.
	Err error
	// TimedOut: Ctx's deadline passed, or a Watch gave up with ErrTimeout.
	TimedOut bool
	// ClientGone: the client went away before its answer was through.
	ClientGone bool
	// Abort: the headers were out and a body that is not an event stream
	// broke. The caller does its accounting, then panics with
	// http.ErrAbortHandler, so that the client cannot take a truncated body
	// for a whole one.
	Abort bool
	// Replaced holds the first bytes of an answer Job.Replace replaced (Err
	// names its target and status).
	Replaced []byte

	bodyErr  error // the client's, reading its request body
	shutdown bool  // the server stopping ended the request
	// timeout is the bound that timed the last attempt out (a Timeout), when
	// Ctx's deadline had not passed: the client is told which one.
	timeout error
}

// Forward passes j's request to its targets in turn until one answers, and
// relays that answer to w. When nothing was committed the caller answers
// itself (see Result.Unserved).
func Forward(w http.ResponseWriter, j *Job) Result {
	ctx := j.Ctx
	if ctx == nil {
		ctx = j.Request.Context()
	}
	bufp := copyPool.Get().(*[]byte)
	defer copyPool.Put(bufp)
	res := Result{Target: -1}
	var lastErr error
	timedOut := false
	for i, t := range j.Targets {
		// A client gone or a deadline passed is not worth another target. Not
		// checked before target 0, whose Acquire releases what the caller holds.
		if i > 0 && (ctx.Err() != nil || j.Request.Context().Err() != nil) {
			break
		}
		release := func() {}
		if j.Acquire != nil {
			rel, ok := j.Acquire(i)
			if !ok {
				continue
			}
			if rel != nil {
				release = rel
			}
		}
		body, ok := j.Body.Next()
		if !ok {
			release()
			break
		}
		res.Target = i
		a, err := j.attempt(ctx, t, i, body, *bufp)
		if err != nil {
			release()
			ae := &AttemptError{Target: t.Name, Err: err}
			lastErr = ae
			if ctx.Err() != nil || j.Request.Context().Err() != nil || j.Body.ClientError() != nil {
				break // the client's doing, or the deadline's: no target's fault
			}
			if errors.Is(err, ErrTimeout) {
				timedOut, res.timeout = true, err
			}
			j.failed(i, ae)
			continue
		}
		if j.retryable(a.resp.StatusCode) && i < len(j.Targets)-1 && j.Body.CanReplay() {
			_, _ = io.Copy(io.Discard, io.LimitReader(a.resp.Body, 64<<10))
			_ = a.resp.Body.Close()
			a.cancel()
			release()
			ae := &AttemptError{Target: t.Name, Status: a.resp.StatusCode}
			lastErr = ae
			j.failed(i, ae)
			continue
		}
		defer release() // deferred: a hook that panics still releases
		if j.Replace != nil {
			if ref := j.Replace(a.resp.StatusCode); ref != nil {
				return j.replace(w, i, a, *bufp, ref)
			}
		}
		return j.relay(ctx, w, i, a, *bufp)
	}
	res.Err = lastErr
	res.TimedOut = timedOut || errors.Is(ctx.Err(), context.DeadlineExceeded)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		res.timeout = nil // the caller's own deadline: its message
	}
	res.ClientGone = j.Request.Context().Err() != nil && !shutdown(j.Request)
	res.shutdown = shutdown(j.Request)
	res.bodyErr = j.Body.ClientError()
	return res
}

// replace answers with ref instead of target i's answer a, keeping the
// answer's head for the log.
func (j *Job) replace(w http.ResponseWriter, i int, a answer, buf []byte, ref *Refusal) Result {
	head := make([]byte, 0, replacedLog)
	if a.n > 0 {
		head = append(head, buf[:min(a.n, replacedLog)]...)
	}
	if rest := replacedLog - len(head); rest > 0 && a.err == nil {
		more, _ := io.ReadAll(io.LimitReader(a.resp.Body, int64(rest)))
		head = append(head, more...)
	}
	_ = a.resp.Body.Close()
	a.cancel()
	if j.OnCommit != nil {
		j.OnCommit(i, ref.Status, w.Header())
	}
	ref.Write(w)
	return Result{Committed: true, Target: i, Status: ref.Status, Code: Code(ref.Status), Replaced: head,
		Err: &AttemptError{Target: j.Targets[i].Name, Status: a.resp.StatusCode}}
}

// Unserved is the answer to a request no target served, or nil when the
// client went away (count CodeClientGone, write nothing). The client's own
// body errors come first — a body that stalls past its read deadline also
// cancels the request's context (net/http does on a read error), and the
// client, still there, is owed its 408 — then 504 when the request timed out
// (naming the attempts' bound that fired, else with timeout: Ctx's deadline),
// else failed (the caller's answer when every target
// failed). Go's error text stays out.
func (r *Result) Unserved(timeout string, failed *Refusal) *Refusal {
	ref, bodyFailed := BodyError(r.bodyErr)
	switch {
	// A body that ended short of its length (the client closed its side) also
	// cancels the context, but the client may still be reading: it is owed
	// the 400, never the empty 200 of a handler that wrote nothing.
	case bodyFailed && (ref.Status != http.StatusBadRequest || errors.Is(r.bodyErr, io.ErrUnexpectedEOF)):
		return ref
	case r.shutdown:
		return &Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Message: "the gateway is shutting down; retry", RetryAfter: 1, Close: true}
	case r.ClientGone:
		return nil
	case bodyFailed:
		return ref
	case r.TimedOut && r.timeout != nil:
		return &Refusal{Status: http.StatusGatewayTimeout, Type: openai.TypeServer, Message: "no endpoint answered in time: " + r.timeout.Error()}
	case r.TimedOut:
		return &Refusal{Status: http.StatusGatewayTimeout, Type: openai.TypeServer, Message: timeout}
	}
	return failed
}

func (j *Job) retryable(status int) bool { return j.RetryStatus != nil && j.RetryStatus(status) }

func (j *Job) failed(i int, err *AttemptError) {
	if j.OnFailure != nil {
		j.OnFailure(i, err)
	}
}

// answer is an attempt's response, with the first bytes read into the relay's
// buffer when the job waits for them.
type answer struct {
	resp   *http.Response
	cancel context.CancelFunc // the attempt's context
	n      int
	err    error // met reading those first bytes (io.EOF: the body ended)
}

// attempt sends the request to target t and waits for its headers, and for
// its first bytes with WaitFirstByte; a Watch that gives up first fails it.
func (j *Job) attempt(ctx context.Context, t Target, i int, body io.ReadCloser, buf []byte) (answer, error) {
	actx, stop := context.WithCancel(ctx)
	cancel := stop
	if j.OnSent != nil {
		s := &sentOnce{}
		actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) {
			if w.Err == nil {
				s.run(func() { j.OnSent(i) })
			}
		}})
		cancel = func() { s.close(); stop() }
	}
	out := j.request(actx, t, body)
	if j.OnAttempt != nil {
		j.OnAttempt(i, out)
	}
	var v *verdict
	if j.Watch != nil {
		v = &verdict{}
		// The watch ends with the attempt: once it returns, the answer is in.
		wctx, stop := context.WithCancel(actx)
		defer stop()
		j.Watch(wctx, i, func(why error) {
			if v.giveUp(why) {
				cancel()
			}
		})
	}
	rt := j.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	resp, err := rt.RoundTrip(out)
	a := answer{resp: resp, cancel: cancel}
	if err == nil && j.WaitFirstByte && !j.retryable(resp.StatusCode) {
		sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		if sse {
			var late *time.Timer
			var timedOut atomic.Bool
			if j.FirstByteTimeout > 0 {
				late = time.AfterFunc(j.FirstByteTimeout, func() { timedOut.Store(true); cancel() })
			}
			a.n, a.err = readFirst(resp.Body, buf)
			if late != nil && !late.Stop() && timedOut.Load() && a.n == 0 {
				a.err = j.firstByteError()
			}
		} else {
			// A whole answer is read as far as the buffer goes before anything
			// is committed: one that breaks within it (most JSON answers are
			// smaller) is retried like a 5xx, where relaying it would end in
			// a cut connection.
			a.n, a.err = fill(resp.Body, buf)
			if a.err != nil && !errors.Is(a.err, io.EOF) {
				a.n = 0 // broken before a byte was sent: the attempt failed
			}
		}
		if a.n == 0 && a.err != nil && !errors.Is(a.err, io.EOF) {
			_ = resp.Body.Close()
			err = a.err
		}
	}
	if err == nil && j.Body.ClientError() != nil {
		// The client's body broke (short, or refused while it streamed): an
		// answer to what the target got of it is not the client's.
		_ = resp.Body.Close()
		err = j.Body.ClientError()
	}
	if v != nil {
		// Whichever came first holds: the answer, or the watcher giving up.
		if why := v.answer(); why != nil {
			if err == nil {
				_ = resp.Body.Close()
			}
			err = why
		}
	}
	if err != nil {
		cancel()
		return answer{}, err
	}
	return a, nil
}

// request builds the request to target t.
func (j *Job) request(ctx context.Context, t Target, body io.ReadCloser) *http.Request {
	r := j.Request
	u := *t.URL
	u.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
	u.RawPath, u.RawQuery = "", r.URL.RawQuery
	out := (&http.Request{
		Method: http.MethodPost, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(r.Header)+2+len(j.Header)), Body: body, Host: u.Host,
		ContentLength: j.Body.size(r.ContentLength),
	}).WithContext(ctx)
	// Lets the transport send the request again on a fresh connection when a
	// pooled one turns out to have been closed by the server, as long as the
	// body can still be sent whole.
	out.GetBody = func() (io.ReadCloser, error) {
		rc, ok := j.Body.Next()
		if !ok {
			return nil, errors.New("request body no longer replayable")
		}
		return rc, nil
	}
	j.Policy.Request(out.Header, r.Header, r.RemoteAddr, j.RequestID)
	for k, vs := range j.Header {
		out.Header[k] = vs
	}
	return out
}

// fill reads into buf until it is full or the body ends (io.EOF) or fails, and
// keeps the body's own error (io.ReadFull would turn a clean end into
// io.ErrUnexpectedEOF, which is also how a cut body with a length reads).
func fill(body io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := body.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// readFirst reads into buf until the body yields bytes or ends.
func readFirst(body io.Reader, buf []byte) (int, error) {
	for {
		n, err := body.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// relay streams target i's answer to the client, flushing server-sent events
// as they arrive and ending a stream that breaks with an error event.
func (j *Job) relay(ctx context.Context, w http.ResponseWriter, i int, a answer, buf []byte) Result {
	resp := a.resp
	defer a.cancel()
	defer func() { _ = resp.Body.Close() }()
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	RemoveHopHeaders(h)
	h.Del("Content-Length") // the body is relayed as it comes
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	if j.OnCommit != nil {
		j.OnCommit(i, resp.StatusCode, h)
	}
	w.WriteHeader(resp.StatusCode)
	res := Result{Committed: true, Target: i, Status: resp.StatusCode,
		SSE: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")}
	rc := http.NewResponseController(w)
	usage := openai.NewUsageReader(res.SSE)
	// An answer silent for IdleTimeout is cut: the attempt's context ends and
	// the read below fails. The timer is armed once and, when it fires early,
	// re-armed for what is left since the last bytes: resetting it on every
	// read cost more than the relay itself.
	// Both bounds are for event streams, long-lived and paced by the model:
	// a whole JSON answer is short, and arming timers for it cost a fifth of
	// a small request's CPU (BenchmarkThroughput).
	idleTimeout, writeTimeout := j.IdleTimeout, j.WriteTimeout
	if !res.SSE {
		idleTimeout, writeTimeout = 0, 0
	}
	var idled atomic.Bool
	var lastRead atomic.Int64 // Unix nanoseconds of the last bytes
	now := time.Now()
	lastRead.Store(now.UnixNano())
	if idleTimeout > 0 {
		var idle *time.Timer
		var mu sync.Mutex // idle is set after AfterFunc returns; the callback reads it
		mu.Lock()
		idle = time.AfterFunc(idleTimeout, func() {
			if left := idleTimeout - time.Since(time.Unix(0, lastRead.Load())); left > 0 {
				mu.Lock()
				idle.Reset(left)
				mu.Unlock()
				return
			}
			idled.Store(true)
			a.cancel()
		})
		mu.Unlock()
		defer func() { mu.Lock(); idle.Stop(); mu.Unlock() }()
	}
	// The client's write deadline rolls forward as it takes writes, renewed
	// once half of it has passed rather than on every write.
	var deadlineAt time.Time
	if writeTimeout > 0 {
		deadlineAt = now
		_ = rc.SetWriteDeadline(now.Add(writeTimeout))
		// Cleared for the next request on the connection, whose writes are
		// not this relay's.
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	// An OpenAI event stream is whole only once it sent its terminator, and
	// each of its events is JSON: one that ended early or garbled is a
	// failure of its target, not a success the client cannot tell apart.
	checked := res.SSE && resp.StatusCode < 300 && Proxied(j.Request.URL.Path)
	n, err := a.n, a.err
	first, clientGone := true, false
	for {
		if n > 0 {
			if idleTimeout > 0 || writeTimeout > 0 {
				now := time.Now()
				lastRead.Store(now.UnixNano())
				if writeTimeout > 0 && now.Sub(deadlineAt) > writeTimeout/2 {
					deadlineAt = now
					_ = rc.SetWriteDeadline(now.Add(writeTimeout))
				}
			}
			if first {
				first = false
				if j.OnFirstByte != nil {
					j.OnFirstByte(i, res.SSE)
				}
			}
			usage.Feed(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				clientGone = true
				break
			}
			if checked && usage.Malformed() > 0 {
				// What follows a garbled event cannot be trusted either: the
				// stream ends here, with an error event after what went out.
				err = errMalformedEvent
				break
			}
			// With the end of the body read in the same call, the data goes out
			// with the response's last chunk when the handler returns: one write,
			// and the client wakes once.
			if res.SSE && err == nil {
				if ferr := rc.Flush(); ferr != nil {
					clientGone = true
					break
				}
			}
		}
		if err != nil {
			break
		}
		n, err = resp.Body.Read(buf)
	}
	if checked && errors.Is(err, io.EOF) && !clientGone {
		usage.Finish()
		switch {
		case usage.Malformed() > 0:
			err = errMalformedEvent
		case !usage.Ended():
			err = errNoTerminator
		}
	}
	broke := err != nil && !errors.Is(err, io.EOF)
	switch {
	case clientGone, broke && j.Request.Context().Err() != nil && !idled.Load() && !shutdown(j.Request):
		// The client went away; its upstream request is cancelled with it.
		res.Code, res.ClientGone = CodeClientGone, true
	case broke:
		res.Code, res.Err = CodeStreamError, &AttemptError{Target: j.Targets[i].Name, Err: err}
		// A read that fails once the deadline passed is the deadline's doing,
		// whichever the transport reported first.
		dl, bounded := ctx.Deadline()
		res.TimedOut = errors.Is(ctx.Err(), context.DeadlineExceeded) || bounded && !time.Now().Before(dl)
		if !res.SSE {
			res.Abort = true
			break
		}
		// The error's text (addresses, Go's wording) stays out: the caller logs
		// res.Err.
		msg, status := j.MidStreamMessage, http.StatusBadGateway
		switch {
		case res.TimedOut:
			msg, status = midStreamTimeout, http.StatusGatewayTimeout
		case idled.Load():
			msg, status = "the model server sent nothing for "+j.IdleTimeout.String()+" (streamIdleTimeout)", http.StatusGatewayTimeout
		case shutdown(j.Request):
			msg, status = "the gateway is shutting down; retry", http.StatusServiceUnavailable
		case errors.Is(err, errNoTerminator), errors.Is(err, errMalformedEvent):
			msg = "the model server's " + err.Error()
		}
		event, _ := json.Marshal(openai.ErrorBody{Error: openai.ErrorDetail{Message: msg, Type: openai.TypeServer, Code: status}})
		if writeTimeout > 0 {
			// The deadline rolls forward with the upstream's data: after a
			// silent upstream it has long passed, and the event must still go.
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		}
		_, _ = fmt.Fprintf(w, "data: %s\n\n", event)
		_ = rc.Flush()
	default:
		res.Code = Code(resp.StatusCode)
	}
	res.Usage.Prompt, res.Usage.Completion, res.Usage.Seen = usage.Usage()
	res.Usage.Events = usage.Events()
	return res
}

// sentOnce runs an attempt's OnSent at most once, and never after the attempt
// ended (close): the transport writes the body on its own goroutine and may
// finish after the answer came, or after the attempt was given up on.
type sentOnce struct {
	mu          sync.Mutex
	done, ended bool
}

func (s *sentOnce) run(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || s.ended {
		return
	}
	s.done = true
	f()
}

func (s *sentOnce) close() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

// verdict settles the race between an answer and a Watch giving up on it: the
// first to claim it wins, so an answer being relayed is never cancelled and
// one given up on is never relayed.
type verdict struct {
	mu      sync.Mutex
	decided bool
	why     error
}

// answer claims the verdict for the answer, or returns why it was given up on.
func (v *verdict) answer() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.decided = true
	return v.why
}

// giveUp claims the verdict for giving up, unless the answer came first.
func (v *verdict) giveUp(why error) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.decided {
		return false
	}
	v.decided, v.why = true, why
	return true
}
