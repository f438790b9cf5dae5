package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/config"
	"github.com/kvgate/kvgate/internal/route"
)

// member is one tier-1 gateway as the router knows it: its configuration, its
// last load summary and its health.
type member struct {
	// cfg is the configuration the member was created with: its name and URLs,
	// which identify it. What a reload may change is in policy.
	cfg Member
	// base is cfg.URL parsed, the base of the requests sent to the member
	// (nil: not a URL, which the configuration's check does not let through).
	base     *url.URL
	policy   atomic.Pointer[memberPolicy]
	inFlight atomic.Int64
	// sent counts requests sent since the last heartbeat: the load the next
	// summary will show, which the chooser counts meanwhile.
	sent atomic.Int64

	mu      sync.Mutex
	summary route.Summary
	lastOK  time.Time // last good heartbeat
	lastErr string
	// healthy as of the last evaluation; a change to healthy after the first
	// one starts a ramp.
	healthy, everHealthy bool
	rampStart            time.Time
	// ejectedUntil is set by failed requests: the member sits out until then
	// even if its heartbeats still answer.
	ejectedUntil time.Time
	failures     int // consecutive 5xx answers
	// runHigh is the most requests per ready endpoint the member was seen to
	// run, by model: a learned capacity (model servers do not publish their
	// max_num_seqs).
	runHigh map[string]float64
	born    time.Time // when the router started following it

	// The heartbeat goroutine's cancel and settings, and whether a reload
	// removed the member: the router's, under its lock.
	stopPoll     func()
	pollSettings settings
	removed      bool
}

// memberPolicy is what the configuration says of a member beyond its identity.
type memberPolicy struct {
	region        string
	price, weight float64
}

func newMember(c Member) *member {
	m := &member{cfg: c, runHigh: map[string]float64{}, born: time.Now(), stopPoll: func() {}}
	if u, err := url.Parse(strings.TrimSuffix(c.URL, "/")); err == nil {
		m.base = u
	}
	m.setPolicy(c)
	return m
}

func (m *member) setPolicy(c Member) {
	m.policy.Store(&memberPolicy{region: c.Region, price: c.Price(), weight: c.CapacityWeight()})
}

// startupGrace is how long after the router starts a member first seen healthy
// counts as found at start (no ramp): a few heartbeats, however slow.
func startupGrace(s settings) time.Duration { return max(5*time.Second, 2*s.heartbeatTimeout) }

// view is a member's state at one instant.
type view struct {
	healthy bool
	// reachable: its heartbeat is fresh and it is not ejected, though it may
	// be draining (taking no new requests, finishing those it has).
	reachable bool
	// fresh: its last good heartbeat is recent, whether or not it is ejected.
	fresh   bool
	ramp    float64
	summary route.Summary
	lastOK  time.Time
	lastErr string
	sent    int64
}

// evaluate recomputes the member's health at now, starting a ramp when it
// comes back, and returns its view.
func (m *member) evaluate(now time.Time, s settings) view {
	m.mu.Lock()
	defer m.mu.Unlock()
	fresh := !m.lastOK.IsZero() && now.Sub(m.lastOK) <= s.heartbeatTimeout
	reachable := fresh && !now.Before(m.ejectedUntil)
	healthy := reachable && !m.summary.Draining
	if healthy && !m.healthy {
		// A member back from being unhealthy ramps up; so does one first seen
		// after the router's start-up (it came up while others had the
		// traffic). The members found at start share it at once.
		if m.everHealthy || now.Sub(m.born) > startupGrace(s) {
			m.rampStart = now
		}
		m.everHealthy = true
	}
	m.healthy = healthy
	ramp := 1.0
	if !m.rampStart.IsZero() && s.rampUp > 0 {
		// From 10% to 100% over the ramp: a returning member gets some traffic
		// at once (its heartbeat says it is up) but not a stampede.
		ramp = min(1, 0.1+0.9*float64(now.Sub(m.rampStart))/float64(s.rampUp))
	}
	return view{healthy: healthy, reachable: reachable, fresh: fresh, ramp: ramp, summary: m.summary, lastOK: m.lastOK, lastErr: m.lastErr, sent: m.sent.Load()}
}

// heartbeat records one summary read.
func (m *member) heartbeat(now time.Time, sum route.Summary, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.lastErr = err.Error()
		return
	}
	m.summary, m.lastOK, m.lastErr = sum, now, ""
	m.sent.Store(0)
	for _, ms := range sum.Models {
		if ms.ReadyEndpoints > 0 {
			m.runHigh[ms.Model] = max(m.runHigh[ms.Model], ms.Running/float64(ms.ReadyEndpoints))
		}
	}
}

// full says whether the member runs, per endpoint, as many requests of the
// model as it ever did (and at least one).
func (m *member) full(model string, runningPerEndpoint float64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	high := m.runHigh[model]
	return high >= 1 && runningPerEndpoint >= high
}

// failed records a request the member failed before answering: a connection
// error ejects it at once (it is likely gone), server errors after three in a
// row. It stays out for the heartbeat timeout, then comes back ramping.
func (m *member) failed(now time.Time, connErr bool, s settings) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failures++
	if connErr || m.failures >= 3 {
		m.ejectedUntil = now.Add(s.heartbeatTimeout)
		m.failures = 0
	}
}

func (m *member) succeeded() {
	m.mu.Lock()
	m.failures = 0
	m.mu.Unlock()
}

// modelLoad finds a model (or adapter) in a summary.
func modelLoad(s route.Summary, model string) (route.ModelSummary, bool) {
	for _, ms := range s.Models {
		if ms.Model == model || slices.Contains(ms.Adapters, model) {
			return ms, true
		}
	}
	return route.ModelSummary{}, false
}

// poll reads a member's summary every interval until ctx ends.
func (m *member) poll(ctx context.Context, client *http.Client, s settings, log *slog.Logger, onChange func()) {
	t := time.NewTicker(s.heartbeat)
	defer t.Stop()
	url := strings.TrimSuffix(m.cfg.AdminURL, "/") + "/summary"
	wasOK := true
	for {
		sum, err := fetchSummary(ctx, client, url, max(s.heartbeat, s.heartbeatTimeout/2))
		if ctx.Err() != nil {
			return
		}
		m.heartbeat(time.Now(), sum, err)
		if (err == nil) != wasOK {
			if err != nil {
				log.Warn("member heartbeat failed", "member", m.cfg.Name, "err", err)
			} else {
				log.Info("member heartbeat back", "member", m.cfg.Name)
			}
			wasOK = err == nil
		}
		onChange()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fetchSummary reads a member's summary. Its errors name the URL redacted:
// they show on /debug/members and in the log, and a signed admin URL carries
// its token in the query.
func fetchSummary(ctx context.Context, client *http.Client, target string, timeout time.Duration) (route.Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var s route.Summary
	shown := config.RedactURL(target)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return s, fmt.Errorf("GET %s: the URL does not parse", shown)
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = shown
		}
		return s, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET %s: %s", shown, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("GET %s: %w", shown, err)
	}
	return s, nil
}
