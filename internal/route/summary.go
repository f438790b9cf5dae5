package route

import (
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/proxy"
)

// This file is the load summary a tier-1 gateway offers the global router
// (`kvgate global`): per model, how many endpoints are ready, how loaded they
// are, and how the last ten seconds of requests went. The global router polls
// it as its heartbeat.

// Summary is the JSON of GET /summary on the admin listener.
type Summary struct {
	Time     time.Time      `json:"time"`
	Draining bool           `json:"draining"`
	Models   []ModelSummary `json:"models"`
	// WindowSeconds is the span the request figures cover.
	WindowSeconds float64 `json:"windowSeconds"`
}

// ModelSummary is one scheduler's load.
type ModelSummary struct {
	Model          string   `json:"model"`
	Scheduler      string   `json:"scheduler"`
	Adapters       []string `json:"adapters,omitempty"`
	Endpoints      int      `json:"endpoints"`
	ReadyEndpoints int      `json:"readyEndpoints"`
	// KVCacheUsage is the mean over the ready endpoints, 0..1.
	KVCacheUsage float64 `json:"kvCacheUsage"`
	Waiting      float64 `json:"waiting"`
	Running      float64 `json:"running"`
	InFlight     int64   `json:"inFlight"`
	// Over the window: requests answered, the share that failed (5xx, and
	// responses that broke after they started) and the share refused by
	// admission (429, 503).
	Requests  int     `json:"requests"`
	ErrorRate float64 `json:"errorRate"`
	ShedRate  float64 `json:"shedRate"`
	// TTFTP50Seconds and TTFTP95Seconds are the median and 95th percentile of
	// the window's times to first byte of streamed responses (0 without
	// samples).
	TTFTP50Seconds float64 `json:"ttftP50Seconds"`
	TTFTP95Seconds float64 `json:"ttftP95Seconds"`
	TTFTSamples    int     `json:"ttftSamples"`
	// MeanDurationSeconds is the mean time successful requests took from
	// arrival to last byte: with Running, how fast a queue drains.
	MeanDurationSeconds float64 `json:"meanDurationSeconds"`
}

// Summary returns the router's load summary.
func (g *Router) Summary() Summary {
	now := g.now()
	out := Summary{Time: now.UTC(), Draining: g.draining.Load(), WindowSeconds: recentWindow.Seconds(), Models: []ModelSummary{}}
	rt := g.routes.Load()
	if rt == nil {
		return out
	}
	for _, p := range rt.schedulers {
		ms := ModelSummary{Model: p.spec.ModelName, Scheduler: p.name, Adapters: p.spec.LoRAAdapters, Endpoints: len(p.endpoints)}
		addrs := make([]string, len(p.endpoints))
		for i, e := range p.endpoints {
			addrs[i] = e.addr
			ms.InFlight += e.inFlight.Load()
		}
		for _, s := range g.fleet.Snapshot(addrs) {
			if !s.Healthy || s.Stale {
				continue
			}
			ms.ReadyEndpoints++
			ms.KVCacheUsage += s.KVUsage
			ms.Waiting += s.Waiting
			ms.Running += s.Running
		}
		if ms.ReadyEndpoints > 0 {
			ms.KVCacheUsage /= float64(ms.ReadyEndpoints)
		}
		w := g.recentOf(p.name).read(now)
		ms.Requests, ms.TTFTSamples, ms.TTFTP50Seconds, ms.TTFTP95Seconds = w.total, w.ttftCount, w.ttftQuantile(0.5), w.ttftQuantile(0.95)
		if w.done > 0 {
			ms.MeanDurationSeconds = w.duration.Seconds() / float64(w.done)
		}
		if w.total > 0 {
			ms.ErrorRate = float64(w.errors) / float64(w.total)
			ms.ShedRate = float64(w.shed) / float64(w.total)
		}
		out.Models = append(out.Models, ms)
	}
	return out
}

// count counts a request in the metrics and in its scheduler's recent window.
func (g *Router) count(sched, model, endpoint, code string) {
	g.countAs(sched, model, endpoint, code, code)
}

// countAs is count with another outcome for the window: a client that went
// away from a 200 is a 499 in the metrics, a 200 for the load summary.
func (g *Router) countAs(sched, model, endpoint, code, window string) {
	g.m.Requests.WithLabelValues(sched, model, endpoint, code).Inc()
	if sched != "" {
		g.recentOf(sched).result(g.now(), window)
	}
}

// observeDuration records a finished request's duration in the metrics and,
// when it succeeded, in the recent window.
func (g *Router) observeDuration(sched, code string, d time.Duration) {
	g.m.Duration.WithLabelValues(sched).Observe(d.Seconds())
	if code == "200" {
		g.recentOf(sched).duration(g.now(), d)
	}
}

// observeTTFT records a time to first byte in the metrics and, for a streamed
// response, in the recent window: a whole JSON body's first byte comes with its
// last, which says nothing of how soon a stream would have started.
func (g *Router) observeTTFT(sched string, d time.Duration, streamed bool) {
	g.m.TTFT.WithLabelValues(sched).Observe(d.Seconds())
	if streamed {
		g.recentOf(sched).ttft(g.now(), d)
	}
}

// recentOf returns a scheduler's recent window; windows outlive reloads.
func (g *Router) recentOf(sched string) *recent {
	if r, ok := g.recents.Load(sched); ok {
		return r.(*recent)
	}
	r, _ := g.recents.LoadOrStore(sched, &recent{})
	return r.(*recent)
}

// The window is short so that routing sees a member recover soon after its
// load drops: a 30 s window kept an idle member's p95 high for half a minute.
const (
	recentBuckets = 10
	recentBucket  = time.Second
	recentWindow  = recentBuckets * recentBucket
	// TTFT bins grow by 25% from 1 ms: 62 bins reach past 1,000 s, and a
	// quantile read from them is within 12% of the truth.
	ttftBins   = 62
	ttftBase   = time.Millisecond
	ttftGrowth = 1.25
)

// recent counts a scheduler's last recentWindow of requests in rotating
// buckets. It is on every request's path, so it takes no lock that requests on
// other cores would contend for: counters are atomic, and the first request of
// a new slot clears the bucket it reuses (an increment racing with that clear
// may be lost — this is a load summary). BenchmarkRequestAccounting: a
// request's metrics and window together cost about 0.6 µs.
type recent struct {
	buckets [recentBuckets]recentBucketCounts
}

type recentBucketCounts struct {
	slot                                 atomic.Int64 // which recentBucket-long slot of time this is
	total, errors, shed, ttftCount, done atomic.Int64
	duration                             atomic.Int64 // of the done requests, in nanoseconds
	ttft                                 [ttftBins]atomic.Uint32
}

// recentCounts is a window's sum.
type recentCounts struct {
	total, errors, shed int
	ttftCount           int
	done                int // successful requests, their durations summed below
	duration            time.Duration
	ttft                [ttftBins]uint32
}

func (r *recent) bucket(now time.Time) *recentBucketCounts { return bucketAt(r.buckets[:], now) }

// bucketAt is the recentBucket-long bucket of buckets that counts now,
// cleared when it last counted an older slot.
func bucketAt(buckets []recentBucketCounts, now time.Time) *recentBucketCounts {
	slot := now.UnixNano() / int64(recentBucket)
	b := &buckets[slot%int64(len(buckets))]
	if old := b.slot.Load(); old != slot && b.slot.CompareAndSwap(old, slot) {
		for _, c := range []*atomic.Int64{&b.total, &b.errors, &b.shed, &b.ttftCount, &b.done, &b.duration} {
			c.Store(0)
		}
		for i := range b.ttft {
			b.ttft[i].Store(0)
		}
	}
	return b
}

func (r *recent) result(now time.Time, code string) {
	b := r.bucket(now)
	b.total.Add(1)
	status, _ := strconv.Atoi(code)
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		b.shed.Add(1)
	case status >= 500, code == proxy.CodeStreamError:
		b.errors.Add(1)
	}
}

func (r *recent) duration(now time.Time, d time.Duration) {
	b := r.bucket(now)
	b.done.Add(1)
	b.duration.Add(int64(d))
}

func (r *recent) ttft(now time.Time, d time.Duration) {
	b := r.bucket(now)
	b.ttftCount.Add(1)
	b.ttft[ttftBin(d)].Add(1)
}

// ttftBin is the bin of the TTFT histograms that counts d.
func ttftBin(d time.Duration) int {
	if d <= ttftBase {
		return 0
	}
	return min(ttftBins-1, int(math.Log(float64(d)/float64(ttftBase))/math.Log(ttftGrowth))+1)
}

// read sums the buckets still inside the window.
func (r *recent) read(now time.Time) recentCounts {
	slot := now.UnixNano() / int64(recentBucket)
	var sum recentCounts
	for i := range r.buckets {
		b := &r.buckets[i]
		if s := b.slot.Load(); s <= slot-recentBuckets || s > slot {
			continue
		}
		sum.total += int(b.total.Load())
		sum.errors += int(b.errors.Load())
		sum.shed += int(b.shed.Load())
		sum.ttftCount += int(b.ttftCount.Load())
		sum.done += int(b.done.Load())
		sum.duration += time.Duration(b.duration.Load())
		for j := range b.ttft {
			sum.ttft[j] += b.ttft[j].Load()
		}
	}
	return sum
}

// ttftQuantile reads a quantile from the bins: the upper edge of the bin that
// holds it.
func (c recentCounts) ttftQuantile(q float64) float64 {
	if c.ttftCount == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(c.ttftCount)))
	seen := 0
	for i, n := range c.ttft {
		seen += int(n)
		if seen >= rank {
			return (time.Duration(float64(ttftBase) * math.Pow(ttftGrowth, float64(i)))).Seconds()
		}
	}
	return 0
}
