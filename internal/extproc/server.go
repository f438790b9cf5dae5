// Package extproc is kvgate's Envoy data plane: an ext_proc gRPC server that plays
// the Gateway API Inference Extension's Endpoint Picker (the same schedulers, pickers,
// prefix index and fleet as `kvgate serve`) or its Body-Based Router.
//
// The request body arrives in FULL_DUPLEX_STREAMED chunks while Envoy holds the
// request headers. The picker reads chunks only until it has the model and the
// prompt's head the decision needs, answers the headers (destination header and
// envoy.lb metadata), then releases the held chunks and echoes every later one
// as it comes: bytes pass through unchanged and are never re-encoded, and a large
// prompt is not buffered whole before the decision.
package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/telemetry"
	"github.com/kvgate/kvgate/internal/tracing"
)

// Names of the Endpoint Picker protocol (GIE proposal 004).
const (
	DestinationHeader  = "x-gateway-destination-endpoint"
	LBNamespace        = "envoy.lb"
	SubsetNamespace    = "envoy.lb.subset_hint"
	SubsetKey          = "x-gateway-destination-endpoint-subset"
	ServedKey          = "x-gateway-destination-endpoint-served"
	ModelHeader        = "x-gateway-model-name"
	BaseModelHeader    = "x-gateway-base-model-name"
	requestIDHeader    = "x-request-id"
	endpointHeader     = "x-kvgate-endpoint"
	schedulerHeader    = "x-kvgate-scheduler"
	contentLengthLimit = 62000 // bytes per body response: under gRPC's and Envoy's limits (GIE uses the same)
)

// objectiveHeader is proxy.ObjectiveHeader as Envoy spells header names.
var objectiveHeader = strings.ToLower(proxy.ObjectiveHeader)

// Options configure a Server.
type Options struct {
	Logger  *slog.Logger
	Metrics *telemetry.ExtProc
	// Fallbacks caps how many fallback endpoints follow the pick in the
	// destination list; negative: as many as the configuration's maxAttempts
	// allows. 0 (one address) is what an ORIGINAL_DST cluster can read; only a
	// data plane that retries down a comma-separated list wants more.
	Fallbacks int
	// BBR makes the server a Body-Based Router instead of an Endpoint Picker.
	BBR *BBR
	// Tracing exports a span per exchange (nil: none); AccessLog writes a
	// line per request (nil: none).
	Tracing   *tracing.Provider
	AccessLog *tracing.AccessLog
}

// Server is the ext_proc service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	gw   Core
	opts Options
	log  *slog.Logger
	m    *telemetry.ExtProc
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// Core is what the Envoy front needs of the routing core (route.Router).
type Core interface {
	// Current is the configuration an exchange is served under, taken once
	// when its headers arrive.
	Current() route.Config
	// CountRefused counts a request refused before it had a scheduler.
	CountRefused(status int)
	// Ready says whether the core can route (gRPC readiness).
	Ready() bool
	Metrics() *telemetry.Gateway
}

// New returns an Endpoint Picker over gw (or a Body-Based Router with opts.BBR).
func New(gw Core, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = telemetry.NewExtProc(gw.Metrics().Registry)
	}
	return &Server{gw: gw, opts: opts, log: opts.Logger, m: opts.Metrics}
}

// Process serves one HTTP request's stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream, ctx: stream.Context(), start: time.Now(), requestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		responseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	defer x.close()
	err := x.run()
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, errDone):
		x.outcome("")
		return nil
	case status.Code(err) == codes.Canceled || x.ctx.Err() != nil:
		x.outcome("") // routed, unless it ended before the pick
		return nil
	case errors.Is(err, errProtocol):
		x.outcome("protocol_error")
		s.log.Warn("ext_proc protocol error", "request_id", x.rid, "err", err)
		return status.Error(codes.InvalidArgument, err.Error())
	default:
		x.outcome("")
		s.log.Debug("ext_proc stream ended", "request_id", x.rid, "err", err)
		return err
	}
}

var (
	// errDone ends a stream after an immediate response.
	errDone = errors.New("immediate response sent")
	// errProtocol is a message out of the protocol's order.
	errProtocol = errors.New("ext_proc protocol")
)

// exchange is one stream's state: one HTTP request and its response.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context
	start  time.Time

	// cfg is the configuration the exchange started under.
	cfg      route.Config
	rid      string
	ridSet   bool // generated here, to be set on the request
	headers  map[string]string
	user     string // the body's user field, for session affinity
	subset   []string
	observed bool // observability mode: answer nothing
	outcomes string

	requestBodyMode, responseBodyMode filterv3.ProcessingMode_BodySendMode

	// Request direction.
	answered bool // the request headers response went out
	reqEOS   bool // the request body's end of stream was seen
	reqBytes int64
	eosAt    time.Time // when the body's last chunk arrived, until it is sent back
	held     *bytes.Buffer
	parts    [][]byte // the held bytes the scan let go of, sent before held
	// guard checks the body the scan did not read for another model; guarded:
	// it was set up (nil then: nothing left to check).
	guard    *openai.Guard
	guarded  bool
	stash    *extprocv3.ProcessingRequest // a message read ahead by the body scan
	route    *route.Route
	identity *auth.Identity // who sent it (spec.auth); nil without
	span     trace.Span     // nil untraced (tracing.go)

	// Response direction.
	status   int
	streamed bool // the response is a stream of server-sent events
	respEOS  bool
	usage    *openai.UsageReader
}

var heldPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (x *exchange) close() {
	if x.route != nil {
		o := x.finalOutcome()
		x.route.Finish(o)
		x.finish(&o)
	} else if x.headers != nil && x.s.opts.BBR == nil {
		x.finish(nil)
	}
	if x.held != nil && x.held.Cap() <= 1<<20 {
		x.held.Reset()
		heldPool.Put(x.held)
	}
	x.held = nil
}

// finalOutcome is the outcome of a routed request whose stream ended.
func (x *exchange) finalOutcome() route.Outcome {
	o := route.Outcome{Status: x.status}
	switch {
	case x.status == 0:
		// No response was shown to the processor: Envoy skips response headers
		// for it, or the request ended before them.
		o.Status = route.StatusUnseen
	case !x.respEOS:
		// The response started and its stream ended early. Envoy closes and then
		// resets the ext_proc stream both when the client goes away and when the
		// upstream breaks, so which of the two it was cannot be told here.
		o.StreamError = true
	}
	if x.usage != nil {
		o.PromptTokens, o.CompletionTokens, o.UsageSeen = x.usage.Usage()
	}
	return o
}

func (x *exchange) outcome(o string) {
	if x.outcomes != "" {
		return
	}
	if o == "" {
		switch {
		case x.observed:
			o = "observed"
		case x.route != nil || x.s.opts.BBR != nil && x.answered:
			o = "routed"
		default:
			o = "aborted"
		}
	}
	x.outcomes = o
	x.s.m.Streams.WithLabelValues(o).Inc()
}

// recv returns the next message, a stashed one first.
func (x *exchange) recv() (*extprocv3.ProcessingRequest, error) {
	if m := x.stash; m != nil {
		x.stash = nil
		return m, nil
	}
	return x.stream.Recv()
}

func (x *exchange) send(r *extprocv3.ProcessingResponse) error {
	if x.observed {
		return nil
	}
	return x.stream.Send(r)
}

func (x *exchange) run() error {
	for {
		msg, err := x.recv()
		if err != nil {
			return err
		}
		if msg.GetObservabilityMode() {
			// Envoy does not wait for answers and applies none: a pick would
			// only reserve an endpoint for a request sent elsewhere.
			x.observed = true
		}
		if x.observed {
			continue
		}
		if pc := msg.GetProtocolConfig(); pc != nil {
			x.requestBodyMode, x.responseBodyMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
		if err := x.handle(msg); err != nil {
			return err
		}
	}
}

func (x *exchange) handle(msg *extprocv3.ProcessingRequest) error {
	switch v := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(msg, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if v.RequestBody.GetEndOfStream() && !x.reqEOS {
			x.eosAt = time.Now()
		}
		return x.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return x.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.responseHeaders(msg, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.respEOS = true
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	default:
		return fmt.Errorf("%w: unexpected message %T", errProtocol, msg.Request)
	}
}

// duplex says whether a direction's body streams in FULL_DUPLEX_STREAMED, where
// body responses carry the bytes; in the other modes a body response only says
// continue.
func duplex(m filterv3.ProcessingMode_BodySendMode) bool {
	return m == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

func (x *exchange) requestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if x.headers != nil {
		return fmt.Errorf("%w: request headers sent twice", errProtocol)
	}
	x.headers = headerMap(h.GetHeaders())
	// One configuration for the whole exchange: a reload meanwhile changes
	// nothing of its rules.
	x.cfg = x.s.gw.Current()
	x.rid = x.headers[requestIDHeader]
	if !proxy.ValidRequestID(x.rid) {
		x.rid, x.ridSet = proxy.NewRequestID(), true
	}
	if x.s.opts.BBR == nil {
		x.startSpan() // refusals are traced too
		// Before anything else, as kvgate serve does: Envoy answers the
		// client with the refusal and the request goes nowhere.
		all := httpHeader(h.GetHeaders())
		id, ref := x.cfg.Authenticate(all, "")
		if ref != nil {
			x.s.log.Debug("request not authenticated", "request_id", x.rid, "status", ref.Status)
			return x.refuse(ref, true)
		}
		x.identity = id
		if _, err := openai.HeaderModel(all.Values(ModelHeader)); err != nil {
			return x.refuse(bodyError(err), false)
		}
	}
	x.subset = subsetHint(msg.GetMetadataContext())
	if cl, err := strconv.ParseInt(x.headers["content-length"], 10, 64); err == nil && x.s.opts.BBR == nil {
		if limit := x.cfg.MaxBody(); limit > 0 && cl > limit {
			return x.refuse(proxy.TooLarge(limit), false)
		}
	}
	x.reqEOS = h.GetEndOfStream()
	if x.s.opts.BBR != nil {
		if x.reqEOS || !duplex(x.requestBodyMode) {
			// No body to read the model from: nothing to add.
			return x.bbrAnswer("no_model", nil)
		}
		return nil // wait for the body
	}
	model := x.headers[ModelHeader]
	switch {
	case x.reqEOS || !duplex(x.requestBodyMode):
		// No body (or none this processor will see): the header decides, or
		// the only scheduler when there is one (GET /v1/models and the like).
		if model == "" {
			model, _ = x.cfg.OnlyModel()
		}
		return x.decide(model, nil)
	case model != "" && x.promptLimit() == 0:
		// The header names the model and no scheduler hashes prompts: decide now and
		// let the whole body stream.
		return x.decide(model, nil)
	}
	return nil
}

func (x *exchange) requestBody(b *extprocv3.HttpBody) error {
	if x.headers == nil {
		return fmt.Errorf("%w: request body before its headers", errProtocol)
	}
	if !duplex(x.requestBodyMode) {
		if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}); err != nil {
			return err
		}
		if b.GetEndOfStream() {
			x.reqEOS = true
			x.sent()
		}
		return nil
	}
	if x.reqEOS {
		// Envoy 1.35+ may send the last chunk of a large body twice: a second
		// decision or echo would corrupt the body or break the stream.
		x.s.m.DuplicateEOS.WithLabelValues("request").Inc()
		return nil
	}
	if !x.answered {
		return x.scanAndDecide(b)
	}
	return x.echoRequest(b.GetBody(), b.GetEndOfStream())
}

// echoRequest passes one request chunk through, once checked for another
// model than the one routed.
func (x *exchange) echoRequest(p []byte, eos bool) error {
	x.reqBytes += int64(len(p))
	if err := x.checkSize(); err != nil {
		return err
	}
	if !x.guarded && x.s.opts.BBR == nil {
		// Routed by the header before the body came: all of it is checked.
		x.guard, x.guarded = openai.NewGuard(x.headers[ModelHeader]), true
	}
	if x.guard != nil {
		if err := x.guard.Check(p); err != nil {
			return x.refuse(bodyError(err), false)
		}
	}
	x.reqEOS = eos
	if err := sendBody(x.send, p, eos, true); err != nil {
		return err
	}
	x.bodySent()
	return nil
}

// sent tells the route, once the request's end went back to Envoy, that the
// endpoint is about to have all of it: its time to first token runs from
// here, the closest this processor sees to the endpoint's own start (Envoy
// forwards the body; a client that uploads slowly must not make the endpoint
// look slow). A body this processor does not see the end of (body mode NONE)
// is never Sent, and teaches the endpoint's speed nothing.
func (x *exchange) sent() {
	if x.route != nil && x.reqEOS && len(x.route.Endpoints) > 0 {
		x.route.Sent(x.route.Endpoints[0])
	}
}

// bodySent records, once the body's end went back to the proxy, how long the
// processor held it.
func (x *exchange) bodySent() {
	x.sent()
	if !x.reqEOS || x.eosAt.IsZero() {
		return
	}
	x.s.m.BodyEndDelay.Observe(time.Since(x.eosAt).Seconds())
	x.eosAt = time.Time{}
}

func (x *exchange) requestTrailers() error {
	if x.headers == nil {
		return fmt.Errorf("%w: request trailers before headers", errProtocol)
	}
	x.reqEOS = true
	if !x.answered {
		// Trailers end a body whose model never came.
		var err error
		if x.s.opts.BBR != nil {
			err = x.bbrAnswer("no_model", nil)
		} else {
			err = x.decide(x.headers[ModelHeader], nil)
		}
		if err != nil {
			return err
		}
	}
	if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}); err != nil {
		return err
	}
	x.sent()
	return nil
}

// scanAndDecide reads the body, from its first chunk on, only as far as the
// decision needs, decides, answers the headers and releases what it held.
func (x *exchange) scanAndDecide(first *extprocv3.HttpBody) error {
	x.held = heldPool.Get().(*bytes.Buffer)
	x.held.Reset()
	r := &chunkReader{x: x, cur: first.GetBody(), eos: first.GetEndOfStream()}
	x.reqBytes = int64(len(r.cur))
	if err := x.checkSize(); err != nil {
		return err
	}
	limit := 0
	if x.s.opts.BBR == nil {
		limit = x.promptLimit()
	}
	// When the header names the model, only the prompt's head (and the user,
	// for sessions) is needed.
	// A body that names its model twice, in another spelling, or another than
	// the header's is refused, in both modes: the model server reads the body.
	picking := x.s.opts.BBR == nil
	header := ""
	if picking {
		header = x.headers[ModelHeader]
	}
	held := 0
	spill := func(p []byte) error {
		held += len(p)
		x.parts = append(x.parts, bytes.Clone(p))
		return nil
	}
	sc, err := openai.ScanFor(r, x.held, openai.Want{PromptLimit: limit, HeaderModel: header, User: picking && x.cfg.WantsUser(), Spill: spill})
	x.user = sc.User
	if r.err != nil {
		return r.err // the stream broke or sent something out of order
	}
	x.guard, x.guarded = sc.Rest, true
	if err == nil && x.guard != nil {
		err = x.guard.Check(r.cur) // read ahead, sent on with the held bytes
	}
	x.s.m.HeldBytes.Observe(float64(held + x.held.Len()))
	var conflict *openai.ConflictError
	if errors.As(err, &conflict) {
		return x.refuse(bodyError(err), false)
	}
	if x.s.opts.BBR != nil {
		return x.routeBody(sc, err, r)
	}
	if err != nil {
		return x.refuse(bodyError(err), false)
	}
	model := header
	if model == "" {
		if !sc.ModelFound {
			return x.refuse(proxy.MissingModel(), false)
		}
		model = sc.Model
	}
	if err := x.decide(model, sc.Prompt); err != nil {
		return err
	}
	return x.release(r)
}

// release sends the held bytes and the unread rest of the current chunk on, as
// they came; the message the scan read ahead, if any, is handled next.
func (x *exchange) release(r *chunkReader) error {
	eos := r.eos && !r.trailers
	for _, p := range x.parts {
		if err := sendBody(x.send, p, false, true); err != nil {
			return err
		}
	}
	x.parts = nil
	if err := sendBody(x.send, x.held.Bytes(), eos && len(r.cur) == 0, true); err != nil {
		return err
	}
	if len(r.cur) > 0 {
		if err := sendBody(x.send, r.cur, eos, true); err != nil {
			return err
		}
		r.cur = nil
	}
	x.reqEOS = r.eos
	if !r.trailers {
		x.bodySent()
	}
	return nil
}

// decide picks an endpoint for the model and answers the request headers.
func (x *exchange) decide(model string, prompt []byte) error {
	if model == "" {
		return x.refuse(proxy.MissingModel(), false)
	}
	size, _ := strconv.ParseInt(x.headers["content-length"], 10, 64)
	if size <= 0 && x.held != nil {
		size = int64(x.held.Len())
	}
	rt, rerr := x.cfg.Route(x.ctx, route.Request{RequestID: x.rid, Model: model, Prompt: prompt, BodyBytes: size, Subset: x.subset, Start: x.start,
		Objective: x.headers[objectiveHeader], User: x.user, Header: func(name string) string { return x.headers[strings.ToLower(name)] },
		Identity: x.identity, Trace: x.keepDecision(), BodyPending: !x.reqEOS})
	if rerr != nil {
		if x.ctx.Err() != nil {
			return x.ctx.Err()
		}
		return x.refuse(rerr, true)
	}
	x.route = rt
	eps := rt.Endpoints
	if n := x.s.opts.Fallbacks; n >= 0 && len(eps) > n+1 {
		eps = eps[:n+1]
	}
	dest := strings.Join(eps, ",")
	set := append([]*corev3.HeaderValueOption{header(DestinationHeader, dest)}, x.traced(rt)...)
	md, err := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{DestinationHeader: dest}})
	if err != nil {
		return err
	}
	if err := x.answerHeaders(set, nil, md); err != nil {
		return err
	}
	x.sent() // a request without a body is all there once its headers go
	return nil
}

// answerHeaders sends the request headers response: the given headers set, the
// control headers stripped, a generated request id added, and the route cache
// cleared so that the route sees the new headers.
func (x *exchange) answerHeaders(set []*corev3.HeaderValueOption, remove []string, md *structpb.Struct) error {
	if x.ridSet {
		set = append(set, header(requestIDHeader, x.rid))
	}
	if x.s.opts.BBR == nil {
		// The body-based router runs before the picker, which still needs them.
		policy := proxy.HeaderPolicy{Tier: proxy.Tier1, StripCredentials: x.cfg.AuthEnabled()}
		for name := range x.headers {
			if policy.Withheld(name) && !setsHeader(set, name) {
				remove = append(remove, name)
			}
		}
		slices.Sort(remove)
	}
	x.answered = true
	return x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
			ClearRouteCache: true,
		}}},
		DynamicMetadata: md,
	})
}

// setsHeader says whether set overwrites the header name: the destination,
// which a client may have sent too, is overwritten rather than removed.
func setsHeader(set []*corev3.HeaderValueOption, name string) bool {
	for _, h := range set {
		if strings.EqualFold(h.GetHeader().GetKey(), name) {
			return true
		}
	}
	return false
}

// refuse answers the request with an OpenAI error instead of routing it, and
// ends the stream. counted says the refusal is already in the request metrics
// (Route counts its own).
func (x *exchange) refuse(e *proxy.Refusal, counted bool) error {
	if x.route == nil && !counted {
		x.s.gw.CountRefused(e.Status)
	}
	if x.route != nil {
		// Refused while the body streamed, after the pick: the endpoint never
		// answered, so the request is not counted against it.
		x.route.Finish(route.Outcome{Status: e.Status, Unanswered: true})
		x.route = nil
	}
	x.outcome("refused")
	x.status = e.Status // the stream ends here: the trace's and access log's status
	hdrs := []*corev3.HeaderValueOption{header("content-type", "application/json"), header(requestIDHeader, x.rid)}
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		hdrs = append(hdrs, header("retry-after", "1"))
	}
	if e.Challenge != "" {
		hdrs = append(hdrs, header("www-authenticate", e.Challenge))
	}
	err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  httpStatus(e.Status),
		Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
		Body:    e.JSON(),
		Details: "kvgate_" + strings.ReplaceAll(strings.ToLower(http.StatusText(e.Status)), " ", "_"),
	}}})
	if err != nil {
		return err
	}
	return errDone
}

func (x *exchange) responseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if !x.answered {
		return fmt.Errorf("%w: response headers before the request was answered", errProtocol)
	}
	hm := headerMap(h.GetHeaders())
	x.status, _ = strconv.Atoi(hm[":status"])
	var set []*corev3.HeaderValueOption
	var remove []string
	if _, ok := hm[ServedKey]; ok {
		remove = append(remove, ServedKey)
	}
	if x.route != nil {
		x.route.Serve(servedEndpoint(msg.GetMetadataContext()))
		x.streamed = strings.HasPrefix(hm["content-type"], "text/event-stream")
		x.usage = openai.NewUsageReader(x.streamed)
		set = append(set, header(schedulerHeader, x.route.Scheduler()))
		if x.route.Expose {
			set = append(set, header(endpointHeader, x.route.Served()))
		} else if _, ok := hm[endpointHeader]; ok {
			remove = append(remove, endpointHeader) // a model server's own must not pass for kvgate's
		}
	}
	if h.GetEndOfStream() || x.responseBodyMode == filterv3.ProcessingMode_NONE {
		// No body follows, or none this processor will see: the status is the
		// outcome.
		x.respEOS = true
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}},
	}}})
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if x.status == 0 {
		return fmt.Errorf("%w: response body before its headers", errProtocol)
	}
	if x.respEOS {
		x.s.m.DuplicateEOS.WithLabelValues("response").Inc()
		return nil
	}
	p, eos := b.GetBody(), b.GetEndOfStream()
	if x.route != nil {
		if len(p) > 0 {
			x.route.FirstByte(x.status, x.streamed)
			x.usage.Feed(p)
		}
	}
	x.respEOS = eos
	if !duplex(x.responseBodyMode) {
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	return sendBody(x.send, p, eos, false)
}

// sendBody sends bytes as streamed body responses of at most contentLengthLimit
// bytes, end of stream on the last one. request selects the direction; empty
// bytes are sent only to carry an end of stream, or when always is set (a held
// body that turned out empty).
func sendBody(send func(*extprocv3.ProcessingResponse) error, p []byte, eos, request bool) error {
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), contentLengthLimit)
		last := n == len(p)
		if n == 0 && !eos {
			return nil
		}
		body := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: p[:n], EndOfStream: eos && last}},
		}}}
		var r *extprocv3.ProcessingResponse
		if request {
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: body}}
		} else {
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: body}}
		}
		if err := send(r); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// chunkReader is the request body as the scan reads it: the chunks of the stream
// pulled one by one from the proxy.
type chunkReader struct {
	x        *exchange
	cur      []byte // the unread rest of the current chunk
	eos      bool   // the chunk that ended the body was read
	trailers bool   // the body ended with trailers, which the scan stashed
	err      error  // a stream failure, which the scan must not mistake for a body error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.eos {
			return 0, io.EOF
		}
		msg, err := r.x.stream.Recv()
		if err != nil {
			r.err = err
			return 0, err
		}
		switch v := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			r.cur, r.eos = v.RequestBody.GetBody(), v.RequestBody.GetEndOfStream()
			if r.eos {
				r.x.eosAt = time.Now()
			}
			r.x.reqBytes += int64(len(r.cur))
			if err := r.x.checkSize(); err != nil {
				r.err = err
				return 0, err
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			r.x.stash, r.eos, r.trailers = msg, true, true
		default:
			r.err = fmt.Errorf("%w: %T while the request body was streaming", errProtocol, msg.Request)
			return 0, r.err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// checkSize refuses a request body that grew past the configured limit, as
// long as its response has not started (a server may answer before reading a
// whole body; that answer stands). A body-based router has no limit of its own.
func (x *exchange) checkSize() error {
	limit := x.cfg.MaxBody()
	if limit <= 0 || x.reqBytes <= limit || x.s.opts.BBR != nil || x.status > 0 {
		return nil
	}
	return x.refuse(proxy.TooLarge(limit), false)
}

// bodyError turns a body the scan could not read, or refused, into a refusal.
func bodyError(err error) *proxy.Refusal {
	if ref, ok := proxy.BodyError(err); ok && ref.Status == http.StatusBadRequest {
		ref.Close = false // Envoy owns the client's connection
		return ref
	}
	return &proxy.Refusal{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Message: err.Error()}
}

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// headerMap flattens Envoy's header map (lower-case names); a repeated header
// keeps its first value.
func headerMap(hm *corev3.HeaderMap) map[string]string {
	out := make(map[string]string, len(hm.GetHeaders()))
	for _, h := range hm.GetHeaders() {
		k := strings.ToLower(h.GetKey())
		if _, ok := out[k]; ok {
			continue
		}
		v := h.GetValue()
		if len(h.GetRawValue()) > 0 {
			v = string(h.GetRawValue())
		}
		out[k] = v
	}
	return out
}

// httpHeader is Envoy's header map as net/http's, every value kept: a
// credential header given twice must be seen twice, and refused.
func httpHeader(hm *corev3.HeaderMap) http.Header {
	out := make(http.Header, len(hm.GetHeaders()))
	for _, h := range hm.GetHeaders() {
		v := h.GetValue()
		if len(h.GetRawValue()) > 0 {
			v = string(h.GetRawValue())
		}
		out.Add(h.GetKey(), v)
	}
	return out
}

// subsetHint reads the proxy's subset hint: nil when absent, empty when present
// and empty.
func subsetHint(md *corev3.Metadata) []string {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := e.GetStringValue(); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for _, s := range strings.Split(k.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// servedEndpoint reads the endpoint the proxy reports it sent the request to.
func servedEndpoint(md *corev3.Metadata) string {
	v := md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
	// A list names the attempts in order; the last one answered.
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.TrimSpace(v)
}

// httpStatus is Envoy's status message for an HTTP status; its enum values are
// the status numbers.
func httpStatus(code int) *typev3.HttpStatus {
	return &typev3.HttpStatus{Code: typev3.StatusCode(code)}
}

// Ready says whether the server can do its job: a picker once its gateway knows
// endpoints, a body-based router at once.
func (s *Server) Ready() bool { return s.opts.BBR != nil || s.gw.Ready() }

// promptLimit is how much of a prompt's head the configuration's prefix
// indexes hash.
func (x *exchange) promptLimit() int {
	return x.cfg.PromptLimit()
}
