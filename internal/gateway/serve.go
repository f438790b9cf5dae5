package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/route"
)

// headPool holds the buffers a request's body head is read into.
var headPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxWholeBody bounds the bodies kept whole for sending (see replayBody.whole):
// past the transport's 32 KiB write buffer the writes split anyway.
const maxWholeBody = 32 << 10

var copyPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ServeHTTP implements the OpenAI data plane.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := proxy.RequestID(r.Header)
	w.Header().Set("X-Request-Id", rid)
	if r.URL.Path == "/v1/models" {
		g.serveModels(w, r)
		return
	}
	if !proxy.Proxied(r.URL.Path) {
		g.refuse(w, nil, &proxy.Refusal{Status: http.StatusNotFound, Type: openai.TypeNotFound, Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		g.refuse(w, nil, &proxy.Refusal{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Message: "method " + r.Method + " not allowed; use POST"})
		return
	}
	maxBody, promptLimit := g.MaxBodyBytes(), g.PromptLimit()
	if !g.Configured() {
		g.refuse(w, nil, &proxy.Refusal{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Message: "the gateway has no configuration yet", RetryAfter: 1})
		return
	}
	if r.ContentLength > maxBody {
		g.refuse(w, nil, proxy.TooLarge(maxBody))
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(start.Add(g.opts.BodyReadTimeout))
	body := http.MaxBytesReader(w, r.Body, maxBody)

	// The model: the header overrides, else the body, read only up to the model.
	head := headPool.Get().(*bytes.Buffer)
	head.Reset()
	defer func() {
		// A body whose model came late may have grown the buffer large; keep only
		// modest buffers for reuse.
		if head.Cap() <= 1<<20 {
			headPool.Put(head)
		}
	}()
	model := r.Header.Get("X-Gateway-Model-Name")
	var prompt []byte
	if model == "" || promptLimit > 0 {
		scan := openai.Scan
		if model != "" {
			scan = openai.ScanPrompt // only the prompt's head is needed
		}
		sc, err := scan(body, head, promptLimit)
		if model == "" {
			if ref, ok := proxy.BodyError(err); ok {
				g.log.Debug("reading request body", "request_id", rid, "err", err)
				g.refuse(w, nil, ref)
				return
			}
			if !sc.ModelFound {
				g.refuse(w, nil, &proxy.Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: route.NoMatchingModel})
				return
			}
			model = sc.Model
		}
		// With the model in a header the body is the model server's business: a
		// body the scan cannot read only goes without prefix affinity.
		if err == nil {
			prompt = sc.Prompt
		}
	}
	size := r.ContentLength
	if size < 0 {
		size = int64(head.Len())
	}
	// Admission and the pick, which reserves the chosen endpoint's slot.
	rt, ref := g.Route(r.Context(), route.Request{RequestID: rid, Model: model, Prompt: prompt, BodyBytes: size, Start: start,
		Objective: r.Header.Get(proxy.ObjectiveHeader), Explain: r.Header.Get("X-Kvgate-Explain") == "1"})
	if ref != nil {
		ref.Write(w) // counted by Route
		return
	}
	ctx := r.Context()
	if at, ok := rt.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, at)
		defer cancel()
	}
	rb := newReplayBody(head.Bytes(), body, rt.RetryBuffer)
	switch {
	case r.ContentLength == 0 && head.Len() == 0:
		rb.rest = nil
	case r.ContentLength == int64(head.Len()) && head.Len() <= maxWholeBody:
		// A copy: the head buffer goes back to the pool when this handler returns,
		// and the transport may still hold the body then.
		rb.whole = bytes.Clone(head.Bytes())
	}
	// Runs before the head buffer goes back to the pool: a transport still holding
	// the last attempt's reader must not read it afterwards.
	defer rb.detach()
	g.forward(ctx, w, r, rt, rb, rid)
}

// refuse answers with a refusal the routing core did not see, and counts it.
func (g *Gateway) refuse(w http.ResponseWriter, rt *route.Route, ref *proxy.Refusal) {
	if rt != nil {
		rt.Finish(route.Outcome{Status: ref.Status, Unanswered: true})
	} else {
		g.CountRefused(ref.Status)
	}
	ref.Write(w)
}

// forward sends the request to the route's ranked endpoints in turn until one
// answers, and streams that answer to the client. The first endpoint arrives
// reserved; a fallback is used only if it has a free slot.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, rt *route.Route, body *replayBody, rid string) {
	var lastErr error
	last := len(rt.Endpoints) - 1
	for i, addr := range rt.Endpoints {
		if i > 0 && !rt.Retry(addr) {
			continue
		}
		rc, ok := body.next()
		if !ok {
			break
		}
		attemptCtx, cancel := context.WithCancel(ctx)
		resp, err := rt.Transport().RoundTrip(upstreamRequest(attemptCtx, r, body, rc, addr, rid))
		if err == nil && resp.StatusCode >= 500 && i < last && body.canReplay() {
			// Worth another endpoint, as the body can still be sent whole.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			cancel()
			g.Metrics().Retries.WithLabelValues(rt.Scheduler(), "status").Inc()
			g.log.Warn("endpoint answered with a server error; trying the next", "request_id", rid, "endpoint", addr, "status", resp.StatusCode)
			lastErr = fmt.Errorf("endpoint %s answered %s", addr, resp.Status)
			continue
		}
		if err != nil {
			cancel()
			lastErr = err
			if ctx.Err() != nil || body.clientError() != nil {
				break
			}
			g.Metrics().Retries.WithLabelValues(rt.Scheduler(), "connect").Inc()
			g.log.Warn("endpoint failed before responding", "request_id", rid, "endpoint", addr, "err", err)
			continue
		}
		// Deferred so that a relay that aborts the connection still releases.
		defer func() {
			resp.Body.Close()
			cancel()
		}()
		g.relay(ctx, w, r, resp, rt, rid)
		return
	}
	// No endpoint answered.
	cerr := body.clientError()
	// The client's own errors first: a body that stalls past its read deadline
	// also cancels the request's context (net/http does on a read error), and
	// the client, still there, is owed its 408.
	ref, bodyFailed := proxy.BodyError(cerr)
	switch {
	case bodyFailed && ref.Status != http.StatusBadRequest:
	case r.Context().Err() != nil:
		rt.Finish(route.Outcome{Unanswered: true})
		return
	case bodyFailed:
	case ctx.Err() != nil:
		ref = &proxy.Refusal{Status: http.StatusGatewayTimeout, Type: openai.TypeServer, Message: "route timeout exceeded before an endpoint answered"}
	default:
		// The endpoint's address and Go's error text stay in the log.
		if lastErr != nil {
			g.log.Warn("no endpoint could serve the request", "request_id", rid, "scheduler", rt.Scheduler(), "err", lastErr)
		}
		ref = &proxy.Refusal{Status: http.StatusBadGateway, Type: openai.TypeServer, Message: "no endpoint could serve the request"}
	}
	g.refuse(w, rt, ref)
}

// upstreamRequest builds the request to one endpoint.
func upstreamRequest(ctx context.Context, r *http.Request, b *replayBody, body io.ReadCloser, addr, rid string) *http.Request {
	out := (&http.Request{
		Method: http.MethodPost, URL: &url.URL{Scheme: "http", Host: addr, Path: r.URL.Path, RawQuery: r.URL.RawQuery},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: make(http.Header, len(r.Header)+2), Body: body, Host: addr,
		ContentLength: r.ContentLength,
	}).WithContext(ctx)
	// Lets the client send the request again on a fresh connection when a pooled one
	// turns out to have been closed by the server, as long as the body still fits the
	// replay buffer.
	out.GetBody = func() (io.ReadCloser, error) {
		rc, ok := b.next()
		if !ok {
			return nil, errors.New("request body no longer replayable")
		}
		return rc, nil
	}
	proxy.RequestHeaders(out.Header, r.Header, r.RemoteAddr, rid, proxy.IsControlHeader)
	return out
}

// relay streams an endpoint's response to the client, flushing server-sent events
// as they arrive and ending a stream that breaks with an explicit error event.
func (g *Gateway) relay(ctx context.Context, w http.ResponseWriter, r *http.Request, resp *http.Response, rt *route.Route, rid string) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	proxy.RemoveHopHeaders(h)
	h.Del("Content-Length") // the body is relayed as it comes
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	h.Set("X-Kvgate-Endpoint", rt.Served())
	h.Set("X-Kvgate-Scheduler", rt.Scheduler())
	if rt.Scores != "" {
		h.Set("X-Kvgate-Scores", rt.Scores)
	}
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	rc := http.NewResponseController(w)
	usage := route.NewUsageReader(sse)
	bufp := copyPool.Get().(*[]byte)
	defer copyPool.Put(bufp)
	buf := *bufp
	var readErr error
	clientGone := false
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			rt.FirstByte(sse)
			usage.Feed(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				clientGone = true
				break
			}
			// With the end of the body read in the same call, the data goes out
			// with the response's last chunk when the handler returns: one write,
			// and the client wakes once.
			if sse && err == nil {
				if ferr := rc.Flush(); ferr != nil {
					clientGone = true
					break
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	o := route.Outcome{Status: resp.StatusCode}
	switch {
	case clientGone, readErr != nil && r.Context().Err() != nil:
		o.ClientGone = true // its upstream request is cancelled with it
	case readErr != nil:
		o.StreamError = true
		// The error's text (addresses, Go's wording) stays in the log below.
		msg, status := "the model server failed mid-response", http.StatusBadGateway
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg, status = "route timeout exceeded mid-response", http.StatusGatewayTimeout
		}
		g.log.Warn("response broke after bytes reached the client", "request_id", rid, "endpoint", rt.Served(), "err", readErr)
		if !sse {
			// Headers are out and the body is not a stream of events: cut the
			// connection so the client cannot take a truncated body for a whole one.
			rt.Finish(o)
			panic(http.ErrAbortHandler)
		}
		event, _ := json.Marshal(openai.ErrorBody{Error: openai.ErrorDetail{Message: msg, Type: openai.TypeServer, Code: status}})
		fmt.Fprintf(w, "data: %s\n\n", event)
		_ = rc.Flush()
	default:
		o.PromptTokens, o.CompletionTokens, o.UsageSeen = usage.Usage()
	}
	rt.Finish(o)
	g.log.Debug("served", "request_id", rid, "scheduler", rt.Scheduler(), "model", rt.Model(), "endpoint", rt.Served(), "status", resp.StatusCode)
}
