package extproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/api/v1alpha1"
	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/waittest"
)

// This file plays Envoy's side of the ext_proc protocol against a real gRPC
// server on loopback, with the generated client: request headers, body chunks
// sent without waiting for answers (FULL_DUPLEX_STREAMED), optionally trailers,
// then — if the picker answered — the request forwarded over HTTP to the picked
// model server and its response streamed back through the processor, as Envoy
// does. Every answer is checked against the protocol's rules as it arrives.

var quiet = slog.New(slog.DiscardHandler)

// testServer is a picker (or router) serving over loopback gRPC.
type testServer struct {
	gw     *hostCore
	srv    *Server
	client extprocv3.ExternalProcessorClient
	addr   string
}

// hostCore is the host of a picker under test: the routing core (its
// methods) and the host's Apply (with peers) and views.
type hostCore struct {
	*route.Router
	h *host.Host
}

func (c *hostCore) Apply(cfg *v1alpha1.InferenceGatewayConfig) error { return c.h.Apply(cfg) }
func (c *hostCore) Replicas() host.ReplicasView                      { return c.h.Replicas() }

// run is kvgate epp: the host with this front, until ctx ends.
func run(ctx context.Context, o host.Options, healthListen string, tlsConfig *tls.Config, xo Options) error {
	xo.Logger = o.Logger
	o.Front = func(ctx context.Context, h *host.Host) (host.Front, error) {
		return Listen(ctx, New(h.Router(), xo), healthListen, tlsConfig)
	}
	return host.Run(ctx, o)
}

func startServer(t testing.TB, cfg *v1alpha1.InferenceGatewayConfig, opts Options, coreOpts ...func(*host.CoreOptions)) *testServer {
	t.Helper()
	o := host.CoreOptions{Logger: quiet}
	for _, f := range coreOpts {
		f(&o)
	}
	h := host.New(o)
	gw := &hostCore{Router: h.Router(), h: h}
	t.Cleanup(h.Close)
	if cfg != nil {
		if err := gw.Apply(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	ts := serveCore(t, gw.Router, opts)
	ts.gw = gw
	if cfg != nil {
		n := 0
		for _, sc := range cfg.Spec.Schedulers {
			n += len(sc.Endpoints)
		}
		// Picks are only meaningful once the fleet has read every endpoint.
		waittest.Until(t, 10*time.Second, "every endpoint scraped", func() bool {
			return ts.metric(t, "kvgate_endpoint_healthy") == float64(n) && ts.metric(t, "kvgate_endpoint_stale") == 0
		})
	}
	return ts
}

// serveCore serves an ext_proc server over core on loopback gRPC.
func serveCore(t testing.TB, core Core, opts Options) *testServer {
	t.Helper()
	s := New(core, opts)
	gs := grpc.NewServer(ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(gs, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	ts := dialServer(t, ln.Addr().String())
	ts.srv = s
	return ts
}

// dialServer connects to an ext_proc server as Envoy would.
func dialServer(t testing.TB, addr string) *testServer {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)),
		// Envoy's HTTP/2 windows are large by default (256 MiB a stream).
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(64<<20), experimental.WithBufferPool(BufferPool()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &testServer{client: extprocv3.NewExternalProcessorClient(conn), addr: addr}
}

func gatewayConfig(schedulers ...v1alpha1.SchedulerSpec) *v1alpha1.InferenceGatewayConfig {
	return &v1alpha1.InferenceGatewayConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: "test"},
		// Tests read which endpoint served (x-kvgate-endpoint), off by default.
		Spec: v1alpha1.InferenceGatewayConfigSpec{BBR: v1alpha1.BBRSpec{Enabled: true}, Schedulers: schedulers,
			Gateway: v1alpha1.GatewaySpec{Diagnostics: &v1alpha1.DiagnosticsSpec{Expose: true}}},
	}
}

// request is one HTTP request as Envoy would present it.
type request struct {
	method, path string
	headers      map[string]string
	// more are header lines sent after headers', a name again included.
	more [][2]string
	body []byte
	// cuts are the body's chunk sizes in order (the rest goes in a last chunk);
	// nil sends the body as one chunk. A trailing 0 sends an empty final chunk.
	cuts []int
	// trailers ends the body with request trailers instead of an end-of-stream
	// chunk.
	trailers bool
	// duplicateEOS sends the last chunk again after the end of stream (Envoy
	// issue 46237).
	duplicateEOS bool
	// subset, when not nil, is sent as the subset hint.
	subset []string
	// holdAfter, when positive, sends only the chunks that hold the first
	// holdAfter bytes, then waits for the pick before sending the rest: a
	// picker that waited for the end of the body fails the test (timeout).
	holdAfter int
	// pickBeforeBody waits for the pick before sending any body byte: it proves
	// the decision needs none.
	pickBeforeBody bool
	// abortAfterChunks cancels the stream after sending that many chunks
	// (before the pick can be known).
	abortAfterChunks int
	// closeAfterChunks half-closes the stream after that many chunks.
	closeAfterChunks int
	// noUpstream stops after the request phase: the stream is cancelled as
	// Envoy resets it when the client goes away before a response.
	noUpstream bool
	// abortMidResponse cancels the stream after that many response chunks.
	abortMidResponse int
	// served, when set, chooses the endpoint reported on the response from the
	// destination list (a fallback).
	served func(dest []string) string
	// observability sets observability mode on every message.
	observability bool
	// modes, when set, is the protocol configuration Envoy sends on the first
	// message (its body modes); the exchange then follows them: a response
	// body mode NONE sends no response body.
	modes *extprocv3.ProtocolConfiguration
}

// played is what Envoy saw of one exchange.
type played struct {
	headers   *extprocv3.CommonResponse // the request headers response
	metadata  *structpb.Struct
	immediate *extprocv3.ImmediateResponse
	// upstreamBody is the request body as the processor released it.
	upstreamBody []byte
	reqEOS       int   // end-of-stream flags on request body responses
	reqChunks    []int // sizes of the request body responses
	reqTrailers  bool
	respHeaders  *extprocv3.CommonResponse
	// upstreamResp is the model server's response body; clientResp what the
	// processor released of it.
	status       int
	upstreamResp []byte
	clientResp   []byte
	respEOS      int
	answers      int // every message received
	serverErr    error
}

// destination is the picked endpoint list, checked equal in header and metadata.
func (p *played) destination(t testing.TB) []string {
	t.Helper()
	if p.headers == nil {
		t.Fatalf("no request headers response (immediate: %v)", p.immediate)
	}
	var h string
	for _, o := range p.headers.GetHeaderMutation().GetSetHeaders() {
		if o.GetHeader().GetKey() == DestinationHeader {
			h = string(o.GetHeader().GetRawValue())
		}
	}
	md := p.metadata.GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	if h == "" || h != md {
		t.Fatalf("destination header %q and envoy.lb metadata %q must be equal and set", h, md)
	}
	if !p.headers.GetClearRouteCache() {
		t.Fatal("clear_route_cache not set with the destination")
	}
	return strings.Split(h, ",")
}

// setHeader returns the value a headers response sets for name.
func setHeader(c *extprocv3.CommonResponse, name string) (string, bool) {
	return mutationValue(c.GetHeaderMutation(), name)
}

func mutationValue(m *extprocv3.HeaderMutation, name string) (string, bool) {
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetKey() == name {
			return string(o.GetHeader().GetRawValue()), true
		}
	}
	return "", false
}

func hdrs(h map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return m
}

// collector receives the processor's answers and checks the protocol's rules.
type collector struct {
	t  testing.TB
	mu sync.Mutex
	p  *played
	// closed as the exchange advances
	picked, reqDone, respHeadersDone, respDone, ended, refused chan struct{}
	violations                                                 []string
	trailersReq                                                bool
}

func (c *collector) fail(format string, args ...any) {
	c.mu.Lock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (c *collector) run(stream extprocv3.ExternalProcessor_ProcessClient) {
	defer closeOnce(c.ended)
	for {
		r, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.p.serverErr = err
			}
			return
		}
		c.p.answers++
		if c.p.immediate != nil {
			c.fail("%T after the immediate response", r.Response)
		}
		switch v := r.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			if c.p.headers != nil && c.p.respHeaders != nil {
				c.fail("immediate response after the response started")
			}
			c.p.immediate = v.ImmediateResponse
			closeOnce(c.refused)
			closeOnce(c.picked)
			closeOnce(c.reqDone)
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if c.p.headers != nil {
				c.fail("second request headers response")
				continue
			}
			c.p.headers, c.p.metadata = v.RequestHeaders.GetResponse(), r.GetDynamicMetadata()
			closeOnce(c.picked)
		case *extprocv3.ProcessingResponse_RequestBody:
			if c.p.headers == nil {
				c.fail("request body response before the headers response (Envoy: spurious message, 500)")
			}
			if c.p.reqEOS > 0 || c.p.reqTrailers {
				c.fail("request body response after its end of stream")
				continue
			}
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				c.fail("request body response without streamed_response (rejected in FULL_DUPLEX_STREAMED)")
				continue
			}
			if len(sr.GetBody()) > contentLengthLimit {
				c.fail("request body response of %d bytes (over %d)", len(sr.GetBody()), contentLengthLimit)
			}
			c.p.upstreamBody = append(c.p.upstreamBody, sr.GetBody()...)
			c.p.reqChunks = append(c.p.reqChunks, len(sr.GetBody()))
			if sr.GetEndOfStream() {
				if c.trailersReq {
					c.fail("end of stream on a body response though the body ended with trailers")
				}
				c.p.reqEOS++
				closeOnce(c.reqDone)
			}
		case *extprocv3.ProcessingResponse_RequestTrailers:
			c.p.reqTrailers = true
			closeOnce(c.reqDone)
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			c.p.respHeaders = v.ResponseHeaders.GetResponse()
			closeOnce(c.respHeadersDone)
		case *extprocv3.ProcessingResponse_ResponseBody:
			if c.p.respHeaders == nil {
				c.fail("response body response before the response headers response")
			}
			if c.p.respEOS > 0 {
				c.fail("response body response after its end of stream")
				continue
			}
			sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				c.fail("response body response without streamed_response")
				continue
			}
			if len(sr.GetBody()) > contentLengthLimit {
				c.fail("response body response of %d bytes", len(sr.GetBody()))
			}
			c.p.clientResp = append(c.p.clientResp, sr.GetBody()...)
			if sr.GetEndOfStream() {
				c.p.respEOS++
				closeOnce(c.respDone)
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			closeOnce(c.respDone)
		default:
			c.fail("unexpected answer %T", r.Response)
		}
	}
}

// wait waits for ch or the end of the stream, failing after a while.
func wait(t testing.TB, ch, ended chan struct{}, what string) bool {
	t.Helper()
	select {
	case <-ch:
		return true
	case <-ended:
		select {
		case <-ch:
			return true
		default:
			return false
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return false
	}
}

// play runs one exchange the way Envoy does and returns what it saw. Protocol
// violations fail the test.
func (s *testServer) play(t testing.TB, req request) *played {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := s.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &played{}
	c := &collector{t: t, p: p, picked: make(chan struct{}), reqDone: make(chan struct{}), respHeadersDone: make(chan struct{}),
		respDone: make(chan struct{}), ended: make(chan struct{}), refused: make(chan struct{}), trailersReq: req.trailers}
	go c.run(stream)
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, v := range c.violations {
			t.Errorf("protocol: %s", v)
		}
	}()

	if req.method == "" {
		req.method = http.MethodPost
	}
	if req.path == "" {
		req.path = "/v1/chat/completions"
	}
	h := map[string]string{":method": req.method, ":path": req.path, ":authority": "gateway", ":scheme": "http", "content-type": "application/json"}
	if len(req.body) > 0 {
		h["content-length"] = strconv.Itoa(len(req.body))
	}
	for k, v := range req.headers {
		h[k] = v
	}
	hm := hdrs(h)
	for _, kv := range req.more {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	first := &extprocv3.ProcessingRequest{ObservabilityMode: req.observability, ProtocolConfig: req.modes, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: len(req.body) == 0 && !req.trailers}}}
	if req.subset != nil {
		list := make([]any, len(req.subset))
		for i, a := range req.subset {
			list[i] = a
		}
		st, _ := structpb.NewStruct(map[string]any{SubsetKey: list})
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}
	}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}

	// The body, in chunks, without waiting for answers.
	chunks := split(req.body, req.cuts)
	if req.pickBeforeBody && !wait(t, c.picked, c.ended, "the pick before the body") {
		return p
	}
	for i, ch := range chunks {
		if req.holdAfter > 0 {
			before := 0
			for _, prev := range chunks[:i] {
				before += len(prev)
			}
			if before >= req.holdAfter {
				if !wait(t, c.picked, c.ended, "the pick before the rest of the body") {
					break
				}
				req.holdAfter = 0
			}
		}
		last := i == len(chunks)-1
		msg := &extprocv3.ProcessingRequest{ObservabilityMode: req.observability, Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: ch, EndOfStream: last && !req.trailers}}}
		if err := stream.Send(msg); err != nil {
			break // the processor ended the stream (an immediate response)
		}
		if req.abortAfterChunks > 0 && i+1 == req.abortAfterChunks {
			cancel()
			<-c.ended
			return p
		}
		if req.closeAfterChunks > 0 && i+1 == req.closeAfterChunks {
			_ = stream.CloseSend()
			<-c.ended
			return p
		}
		if last && req.duplicateEOS {
			_ = stream.Send(msg)
		}
	}
	if req.trailers {
		_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	}
	if req.observability {
		_ = stream.CloseSend()
		<-c.ended
		return p
	}
	// The collector writes p as answers come; p's fields are read here only
	// once a channel closed after the write says they are final.
	refused := func() bool {
		select {
		case <-c.refused:
			<-c.ended
			return true
		default:
			return false
		}
	}
	if !wait(t, c.picked, c.ended, "the request headers response") || refused() {
		<-c.ended
		return p
	}
	if len(req.body) > 0 || req.trailers {
		if !wait(t, c.reqDone, c.ended, "the request body's end") || refused() {
			<-c.ended
			return p
		}
	}
	if req.noUpstream {
		cancel()
		<-c.ended
		return p
	}

	// Upstream: Envoy sends the request to the first destination (or, in a
	// test, to the fallback it pretends to have retried on).
	dest := p.destination(t)
	served := dest[0]
	if req.served != nil {
		served = req.served(dest)
	}
	out, _ := http.NewRequest(req.method, "http://"+dest[0]+req.path, bytes.NewReader(p.upstreamBody))
	for k, v := range h {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			out.Header.Set(k, v)
		}
	}
	for _, rm := range p.headers.GetHeaderMutation().GetRemoveHeaders() {
		out.Header.Del(rm)
	}
	for _, o := range p.headers.GetHeaderMutation().GetSetHeaders() {
		out.Header.Set(o.GetHeader().GetKey(), string(o.GetHeader().GetRawValue()))
	}
	out.URL.Host = served
	resp, err := http.DefaultClient.Do(out)
	if err != nil {
		t.Fatalf("upstream %s: %v", served, err)
	}
	defer resp.Body.Close()
	p.status = resp.StatusCode
	md, _ := structpb.NewStruct(map[string]any{ServedKey: served})
	rh := map[string]string{":status": strconv.Itoa(resp.StatusCode), "content-type": resp.Header.Get("Content-Type")}
	if err := stream.Send(&extprocv3.ProcessingRequest{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: md}},
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(rh)}}}); err != nil {
		t.Fatal(err)
	}
	wait(t, c.respHeadersDone, c.ended, "the response headers response")
	if req.modes != nil && req.modes.GetResponseBodyMode() == filterv3.ProcessingMode_NONE {
		// Envoy streams the response to the client itself and closes the
		// ext_proc stream at its end.
		p.upstreamResp, _ = io.ReadAll(resp.Body)
		_ = stream.CloseSend()
		<-c.ended
		return p
	}
	buf := make([]byte, 4096)
	n := 0
	for {
		k, rerr := resp.Body.Read(buf)
		if k > 0 {
			p.upstreamResp = append(p.upstreamResp, buf[:k]...)
			_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:k])}}})
			n++
			if req.abortMidResponse > 0 && n == req.abortMidResponse {
				cancel()
				<-c.ended
				return p
			}
		}
		if rerr != nil {
			break
		}
	}
	_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
	wait(t, c.respDone, c.ended, "the response body's end")
	_ = stream.CloseSend()
	<-c.ended
	return p
}

// open starts a raw stream for tests that drive the protocol by hand.
func (s *testServer) open(t testing.TB) (context.CancelFunc, extprocv3.ExternalProcessor_ProcessClient) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := s.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return cancel, stream
}

// sendRequest sends a POST's headers and its body in one chunk.
func sendRequest(t testing.TB, stream extprocv3.ExternalProcessor_ProcessClient, body []byte) {
	t.Helper()
	h := map[string]string{":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(h)}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
}

// split cuts b into chunks of the given sizes, the rest in a last chunk; a
// trailing 0 adds an empty last chunk.
func split(b []byte, cuts []int) [][]byte {
	if len(b) == 0 {
		return nil
	}
	if cuts == nil {
		return [][]byte{b}
	}
	var out [][]byte
	for _, n := range cuts {
		if n == 0 {
			continue
		}
		n = min(n, len(b))
		out = append(out, b[:n])
		b = b[n:]
		if len(b) == 0 {
			break
		}
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	if len(cuts) > 0 && cuts[len(cuts)-1] == 0 {
		out = append(out, []byte{})
	}
	return out
}
