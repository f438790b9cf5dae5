package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/internal/simserver"
)

// BenchmarkOverhead measures what the picker adds to a request on Envoy's side
// of the protocol with 100 concurrent streams over one connection, each a
// request whose response streams for about a second (an event every 20 ms), as
// 100 concurrent clients of a model server produce them. Reported: the time from
// Envoy sending the body's last chunk to receiving it back (the request cannot
// reach the model server earlier) and the time from the request headers to the
// pick. The "saturated" cases send the next request as soon as the previous one
// ends, with no response time: they measure the most the process can take, and
// their latencies are queueing on 2 cores. The client runs in the same process
// on the same cores, so its own gRPC work is included. docs/benchmarks.md
// quotes it:
//
//	go test -run '^$' -bench Overhead -benchtime 2000x ./internal/extproc/
func BenchmarkOverhead(b *testing.B) {
	var s *testServer
	if addr := os.Getenv("KVGATE_EPP_ADDR"); addr != "" {
		// A picker in its own process (kvgate epp), so that the client's work,
		// which is Envoy's in production, does not share its cores.
		s = dialServer(b, addr)
	} else {
		addrs := startSims(b, 4, simserver.Options{})
		s = startServer(b, gatewayConfig(pool(addrs...)), Options{})
	}
	// 220 KB: the prompt size of GIE issue 2928, with a shared system prompt.
	model := llama
	if m := os.Getenv("KVGATE_EPP_MODEL"); m != "" {
		model = m
	}
	small := chatBody(model, "Write a haiku about GPUs.", `"stream":true`)
	large := chatBody(model, strings.Repeat("Context paragraph about the quarterly accounts. ", 4600), `"stream":true`)
	for _, tc := range []struct {
		name  string
		body  []byte
		chunk int // Envoy reads a downstream body in chunks of about 16 KiB
		// events is how many response events each request streams, gap apart.
		events  int
		gap     time.Duration
		workers int
	}{
		{"small/c100", small, 0, 50, 20 * time.Millisecond, 100},
		{"220KB/c100", large, 16 << 10, 50, 20 * time.Millisecond, 100},
		{"220KB/c1", large, 16 << 10, 1, 0, 1},
		{"small/c100-saturated", small, 0, 1, 0, 100},
		{"220KB/c100-saturated", large, 16 << 10, 1, 0, 100},
	} {
		b.Run(tc.name, func(b *testing.B) {
			workers := tc.workers
			chunk := tc.chunk
			if chunk == 0 {
				chunk = len(tc.body)
			}
			chunks := split(tc.body, slices.Repeat([]int{chunk}, len(tc.body)/chunk+1))
			var mu sync.Mutex
			var added, toPick []time.Duration
			next := make(chan struct{})
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					// Staggered, so that the streams are spread over the response
					// time rather than arriving together.
					time.Sleep(time.Duration(w) * tc.gap * time.Duration(tc.events) / time.Duration(workers))
					for range next {
						a, p, err := s.exchange(chunks, tc.events, tc.gap)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						added, toPick = append(added, a), append(toPick, p)
						mu.Unlock()
					}
				})
			}
			var before []bucket
			if s.gw != nil {
				before = buckets(b, s, "kvgate_extproc_body_end_delay_seconds")
			}
			b.ResetTimer()
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			wg.Wait()
			b.StopTimer()
			slices.Sort(added)
			slices.Sort(toPick)
			q := func(d []time.Duration, p float64) float64 {
				if len(d) == 0 {
					return 0
				}
				return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(q(added, 0.5), "added-p50-ms")
			b.ReportMetric(q(added, 0.99), "added-p99-ms")
			b.ReportMetric(q(toPick, 0.5), "pick-p50-ms")
			b.ReportMetric(q(toPick, 0.99), "pick-p99-ms")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			if s.gw != nil {
				// The picker's own share, from its histogram: the body's end from
				// its arrival to its return, at the bucket's upper bound.
				d := diff(buckets(b, s, "kvgate_extproc_body_end_delay_seconds"), before)
				b.ReportMetric(quantile(d, 0.5)*1000, "held-p50-ms")
				b.ReportMetric(quantile(d, 0.99)*1000, "held-p99-ms")
			}
		})
	}
}

// exchange plays one request through the picker as Envoy does, with a response
// of events SSE events gap apart, and returns the time Envoy waited for the
// body's last chunk to come back and the time to the pick.
func (s *testServer) exchange(chunks [][]byte, events int, gap time.Duration) (added, toPick time.Duration, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := s.client.Process(ctx)
	if err != nil {
		return 0, 0, err
	}
	h := map[string]string{":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
	start := time.Now()
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(h)}}}); err != nil {
		return 0, 0, err
	}
	var lastSent time.Time
	sendErr := make(chan error, 1)
	go func() {
		for i, c := range chunks {
			if i == len(chunks)-1 {
				lastSent = time.Now()
			}
			if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1}}}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	var dest string
	for {
		r, err := stream.Recv()
		if err != nil {
			return 0, 0, err
		}
		if hr := r.GetRequestHeaders(); hr != nil {
			toPick = time.Since(start)
			dest, _ = setHeader(hr.GetResponse(), DestinationHeader)
			continue
		}
		if ir := r.GetImmediateResponse(); ir != nil {
			return 0, 0, fmt.Errorf("refused: %d %s", ir.GetStatus().GetCode(), ir.GetBody())
		}
		if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	if err := <-sendErr; err != nil {
		return 0, 0, err
	}
	added = time.Since(lastSent)
	md, _ := structpb.NewStruct(map[string]any{ServedKey: dest})
	rh := map[string]string{":status": "200", "content-type": "text/event-stream"}
	msgs := []*extprocv3.ProcessingRequest{
		{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: md}},
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(rh)}}},
	}
	event := []byte(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"}}]}` + "\n\n")
	for range events {
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: event}}})
	}
	msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}})
	for i, m := range msgs {
		if i > 0 && gap > 0 {
			time.Sleep(gap)
		}
		if err := stream.Send(m); err != nil {
			return 0, 0, err
		}
		if _, err := stream.Recv(); err != nil {
			return 0, 0, err
		}
	}
	_ = stream.CloseSend()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return 0, 0, fmt.Errorf("stream end: %w", err)
	}
	return added, toPick, nil
}

type bucket struct {
	upper float64
	count uint64
}

// buckets reads a histogram's cumulative buckets from the picker's registry.
func buckets(b *testing.B, s *testServer, name string) []bucket {
	fams, err := s.gw.Metrics().Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			var out []bucket
			for _, bk := range f.GetMetric()[0].GetHistogram().GetBucket() {
				out = append(out, bucket{bk.GetUpperBound(), bk.GetCumulativeCount()})
			}
			return out
		}
	}
	return nil
}

func diff(after, before []bucket) []bucket {
	out := slices.Clone(after)
	for i := range out {
		if i < len(before) {
			out[i].count -= before[i].count
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding the q-quantile.
func quantile(bs []bucket, q float64) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	rank := uint64(q * float64(bs[len(bs)-1].count))
	for _, bk := range bs {
		if bk.count >= rank {
			return bk.upper
		}
	}
	return bs[len(bs)-1].upper
}
