package route

import (
	"math"
	"sync/atomic"
	"time"
)

// This file counts each endpoint's last minute of requests for the fleet page
// (/debug/fleet's lastMinute): requests per second, TTFT quantiles and a TTFT
// series, one point a second. It uses the load summary's lock-free buckets
// (summary.go), sixty of them; an endpoint allocates its window with its first
// request, so the pods of an idle pool cost nothing.

const minuteBuckets = 60

// lastMinute is an endpoint's last minute of requests.
type lastMinute struct {
	first   atomic.Int64 // unix nanoseconds of the first request counted
	buckets [minuteBuckets]recentBucketCounts
}

// EndpointMinute is an endpoint's last minute in /debug/fleet.
type EndpointMinute struct {
	// Requests counts the requests it answered (or failed) in the minute;
	// RequestsPerSecond is that over the minute, or over the time since its
	// first request when that is shorter.
	Requests          int     `json:"requests"`
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	// TTFT of streamed responses, from the request's arrival at the gateway
	// to its first byte (as /summary counts it), within 12%.
	TTFTP50Seconds float64 `json:"ttftP50Seconds"`
	TTFTP95Seconds float64 `json:"ttftP95Seconds"`
	TTFTSamples    int     `json:"ttftSamples"`
	// TTFTSeries is the minute second by second, oldest first.
	TTFTSeries TTFTSeries `json:"ttftSeries"`
}

// TTFTSeries is a TTFT series, one point a StepSeconds; a point without
// samples is 0.
type TTFTSeries struct {
	// End is the start of the last point's second.
	End         time.Time `json:"end"`
	StepSeconds float64   `json:"stepSeconds"`
	P50         []float64 `json:"p50"`
	P95         []float64 `json:"p95"`
	Samples     []int     `json:"samples"`
}

// minuteOf returns the endpoint's window, allocating it at the first request.
func (e *endpoint) minuteOf(now time.Time) *lastMinute {
	if m := e.minute.Load(); m != nil {
		return m
	}
	m := &lastMinute{}
	m.first.Store(now.UnixNano())
	if e.minute.CompareAndSwap(nil, m) {
		return m
	}
	return e.minute.Load()
}

// countMinute counts an ended request in the endpoint's last minute.
func (e *endpoint) countMinute(now time.Time) {
	bucketAt(e.minuteOf(now).buckets[:], now).total.Add(1)
}

// ttftMinute records a streamed response's TTFT in the endpoint's last minute.
func (e *endpoint) ttftMinute(now time.Time, d time.Duration) {
	b := bucketAt(e.minuteOf(now).buckets[:], now)
	b.ttftCount.Add(1)
	b.ttft[ttftBin(d)].Add(1)
}

// minuteView reads the endpoint's last minute at now.
func (e *endpoint) minuteView(now time.Time) EndpointMinute {
	slot := now.UnixNano() / int64(recentBucket)
	v := EndpointMinute{TTFTSeries: TTFTSeries{End: time.Unix(0, slot*int64(recentBucket)).UTC(), StepSeconds: recentBucket.Seconds(),
		P50: make([]float64, minuteBuckets), P95: make([]float64, minuteBuckets), Samples: make([]int, minuteBuckets)}}
	m := e.minute.Load()
	if m == nil {
		return v
	}
	var sum recentCounts
	for i := range minuteBuckets {
		s := slot - minuteBuckets + 1 + int64(i) // point i's slot
		b := &m.buckets[s%minuteBuckets]
		if b.slot.Load() != s {
			continue
		}
		var c recentCounts
		c.total, c.ttftCount = int(b.total.Load()), int(b.ttftCount.Load())
		for j := range b.ttft {
			c.ttft[j] = b.ttft[j].Load()
			sum.ttft[j] += c.ttft[j]
		}
		sum.total += c.total
		sum.ttftCount += c.ttftCount
		v.TTFTSeries.P50[i], v.TTFTSeries.P95[i], v.TTFTSeries.Samples[i] = round3(c.ttftQuantile(0.5)), round3(c.ttftQuantile(0.95)), c.ttftCount
	}
	v.Requests, v.TTFTSamples = sum.total, sum.ttftCount
	v.TTFTP50Seconds, v.TTFTP95Seconds = round3(sum.ttftQuantile(0.5)), round3(sum.ttftQuantile(0.95))
	// A window younger than the minute is read over its own span, counted in
	// whole seconds so that the first request does not read as a burst.
	span := min(time.Minute, max(time.Second, now.Sub(time.Unix(0, m.first.Load())).Truncate(time.Second)+time.Second))
	v.RequestsPerSecond = round3(float64(sum.total) / span.Seconds())
	return v
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
