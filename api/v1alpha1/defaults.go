package v1alpha1

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The accessors below return a field's value or its default, so that code reading a
// configuration never repeats the defaults.

// MaxBodyBytes is the body limit.
func (b BBRSpec) MaxBodyBytes() int64 {
	if b.MaxRequestBodyBytes != nil {
		return *b.MaxRequestBodyBytes
	}
	return DefaultMaxRequestBodyBytes
}

// Port is the model servers' port.
func (s SchedulerSpec) Port() int {
	if s.TargetPort != nil {
		return int(*s.TargetPort)
	}
	return DefaultTargetPort
}

// H2C says whether the model servers speak HTTP/2 without TLS.
func (s SchedulerSpec) H2C() bool { return s.AppProtocol == AppProtocolH2C }

// HTTPS says whether the model servers are reached over TLS.
func (s SchedulerSpec) HTTPS() bool { return s.AppProtocol == AppProtocolHTTPS }

// MaxBuffered bounds the request bytes held in memory at once.
func (g GatewaySpec) MaxBuffered() int64 {
	if g.MaxBufferedBytes != nil {
		return *g.MaxBufferedBytes
	}
	return DefaultMaxBufferedBytes
}

// ExposesTo says whether a request of tenant (authenticated, or "" with
// authenticated false) may read routing internals.
func (g GatewaySpec) ExposesTo(tenant string, authenticated bool) bool {
	d := g.Diagnostics
	if d == nil || !d.Expose {
		return false
	}
	return len(d.Tenants) == 0 || (authenticated && slices.Contains(d.Tenants, tenant))
}

// Serves says whether a scheduler takes requests of tenant.
func (s SchedulerSpec) Serves(tenant string) bool {
	return len(s.AllowedTenants) == 0 || slices.Contains(s.AllowedTenants, tenant)
}

// Timeout is the route timeout, 0 for none.
func (s SchedulerSpec) Timeout() time.Duration {
	return DurationOr(s.RouteTimeout, DefaultRouteTimeout)
}

// SLO is the scheduler's time-to-first-token objective, 0 for none.
func (s SchedulerSpec) SLO() time.Duration { return DurationOr(s.TTFTSLO, 0) }

// SessionHeader is the header a session key comes from, "" when sessions are
// off or the key comes from the body's user field.
func (s SchedulerSpec) SessionHeader() string {
	if a := s.SessionAffinity; a != nil && !a.FromUser {
		if a.Header != "" {
			return a.Header
		}
		return DefaultSessionHeader
	}
	return ""
}

// SessionFromUser says whether the session key is the body's user field.
func (s SchedulerSpec) SessionFromUser() bool {
	return s.SessionAffinity != nil && s.SessionAffinity.FromUser
}

// SessionTTL is how long a session is remembered after its last request.
func (s SchedulerSpec) SessionTTL() time.Duration {
	if a := s.SessionAffinity; a != nil {
		return DurationOr(a.TTL, DefaultSessionTTL)
	}
	return DefaultSessionTTL
}

// PickerName is the picker, "kvgate" when unset.
func (s SchedulerSpec) PickerName() string {
	if s.Picker != "" {
		return s.Picker
	}
	return "kvgate"
}

// Attempts is how many endpoints a request may try.
func (g GatewaySpec) Attempts() int {
	if g.MaxAttempts != nil {
		return int(*g.MaxAttempts)
	}
	return DefaultMaxAttempts
}

// InFlightLimit is the per-endpoint saturation point, 0 for none.
func (g GatewaySpec) InFlightLimit() int {
	if g.MaxInFlightPerEndpoint != nil {
		return int(*g.MaxInFlightPerEndpoint)
	}
	return 0
}

// QueueWait is how long a request waits for a saturated pool.
func (g GatewaySpec) QueueWait() time.Duration {
	if g.QueueTimeout != nil {
		return g.QueueTimeout.Duration
	}
	return DefaultQueueTimeout
}

// Connect bounds dialling.
func (g GatewaySpec) Connect() time.Duration {
	if g.ConnectTimeout != nil {
		return g.ConnectTimeout.Duration
	}
	return DefaultConnectTimeout
}

// HeaderTimeout bounds the wait for response headers, 0 for none.
func (g GatewaySpec) HeaderTimeout() time.Duration {
	return DurationOr(g.ResponseHeaderTimeout, DefaultHeaderTimeout)
}

// FirstByte bounds the wait from a stream's headers to its first event, 0 for
// none.
func (g GatewaySpec) FirstByte() time.Duration {
	return DurationOr(g.FirstByteTimeout, DefaultFirstByteTimeout)
}

// StreamIdle ends a started response silent this long, 0 for never.
func (g GatewaySpec) StreamIdle() time.Duration {
	return DurationOr(g.StreamIdleTimeout, DefaultStreamIdleTimeout)
}

// ClientWrite ends a request whose client takes no write this long, 0 for never.
func (g GatewaySpec) ClientWrite() time.Duration {
	return DurationOr(g.ClientWriteTimeout, DefaultClientWriteTimeout)
}

// RetryBuffer is how much of a body is kept for replay.
func (g GatewaySpec) RetryBuffer() int64 {
	if g.RetryBufferBytes != nil {
		return *g.RetryBufferBytes
	}
	return DefaultRetryBufferBytes
}

// SaturationQueue is the waiting count that saturates an endpoint.
func (s SchedulerSpec) SaturationQueue() int {
	if s.Saturation != nil && s.Saturation.QueueDepth != nil {
		return int(*s.Saturation.QueueDepth)
	}
	return DefaultSaturationQueue
}

// SaturationKV is the KV-cache usage, 0..1, that saturates an endpoint.
func (s SchedulerSpec) SaturationKV() float64 {
	if s.Saturation != nil && s.Saturation.KVCachePercent != nil {
		return float64(*s.Saturation.KVCachePercent) / 100
	}
	return DefaultSaturationKVPercent / 100.0
}

// PrefixBlockChars is the prefix index's block size in characters.
func (s SchedulerSpec) PrefixBlockChars() int {
	if s.Prefix != nil && s.Prefix.BlockChars != nil {
		return int(*s.Prefix.BlockChars)
	}
	return DefaultPrefixBlockChars
}

// PrefixMaxBlocks is how many leading blocks are matched.
func (s SchedulerSpec) PrefixMaxBlocks() int {
	if s.Prefix != nil && s.Prefix.MaxBlocks != nil {
		return int(*s.Prefix.MaxBlocks)
	}
	return DefaultPrefixMaxBlocks
}

// PrefixCapacity is the blocks an endpoint of unknown KV size is remembered to hold.
func (s SchedulerSpec) PrefixCapacity() int {
	if s.Prefix != nil && s.Prefix.CapacityBlocks != nil {
		return int(*s.Prefix.CapacityBlocks)
	}
	return DefaultPrefixCapacity
}

// ProfileName is the scheduler's weight profile, ProfileKvgate when unset.
func (s SchedulerSpec) ProfileName() string {
	if s.Profile != "" {
		return s.Profile
	}
	return string(ProfileKvgate)
}

// DurationOr is d, or def when d is unset: how every optional duration of
// kvgate's configuration files takes its default.
func DurationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d != nil {
		return d.Duration
	}
	return def
}

// TenantClaimName is the claim holding a token's tenant.
func (j JWTSpec) TenantClaimName() string {
	if j.TenantClaim != "" {
		return j.TenantClaim
	}
	return DefaultTenantClaim
}

// Refresh is how often the JWKS is fetched again.
func (j JWTSpec) Refresh() time.Duration {
	return DurationOr(j.RefreshInterval, DefaultRefreshInterval)
}

// Skew is the clock skew allowed on exp and nbf.
func (j JWTSpec) Skew() time.Duration { return DurationOr(j.Leeway, DefaultLeeway) }

// Fetch bounds one fetch of the JWKS.
func (j JWTSpec) Fetch() time.Duration { return DurationOr(j.FetchTimeout, DefaultFetchTimeout) }

// ScrapeInterval is the time between two scrapes of an endpoint.
func (g GatewaySpec) ScrapeInterval() time.Duration {
	if g.Scrape == nil {
		return DefaultScrapeInterval
	}
	return DurationOr(g.Scrape.Interval, DefaultScrapeInterval)
}

// ScrapeTimeout bounds one scrape.
func (g GatewaySpec) ScrapeTimeout() time.Duration {
	if g.Scrape == nil {
		return DefaultScrapeTimeout
	}
	return DurationOr(g.Scrape.Timeout, DefaultScrapeTimeout)
}

// StaleAfter is the age at which metrics are stale.
func (g GatewaySpec) StaleAfter() time.Duration {
	if g.Scrape == nil {
		return DefaultStaleAfter
	}
	return DurationOr(g.Scrape.StaleAfter, DefaultStaleAfter)
}

// UnhealthyAfter is how many failed scrapes in a row make an endpoint unhealthy.
func (g GatewaySpec) UnhealthyAfter() int {
	if g.Scrape != nil && g.Scrape.UnhealthyAfter != nil {
		return int(*g.Scrape.UnhealthyAfter)
	}
	return DefaultUnhealthyAfter
}

// ByName lists the weights by scorer name; unset ones are nil. It is the one
// place that ties a field to its scorer: a scorer added to the picker without
// a field here fails internal/schedule's tests.
func (w Weights) ByName() map[ScorerName]*int32 {
	return map[ScorerName]*int32{ScorerQueue: w.Queue, ScorerKVCache: w.KVCache, ScorerPrefix: w.Prefix,
		ScorerLoRAAffinity: w.LoRAAffinity, ScorerRunningRequests: w.RunningRequests, ScorerPrefillQueue: w.PrefillQueue,
		ScorerErrorRate: w.ErrorRate, ScorerPredictedLatency: w.PredictedLatency, ScorerSessionAffinity: w.SessionAffinity,
		ScorerTokenLoad: w.TokenLoad, ScorerKVCost: w.KVCost}
}

// Outliers is the outlier detection in force: failures in a row that eject an
// endpoint (0: never), the first ejection's length, and the largest share of a
// scheduler's endpoints ejected at once (0..1).
func (g GatewaySpec) Outliers() (failures int, base time.Duration, maxShare float64) {
	failures, base, pct := DefaultOutlierFailures, DefaultBaseEjectionTime, int32(DefaultMaxEjectionPercent)
	if o := g.OutlierDetection; o != nil {
		if o.ConsecutiveFailures != nil {
			failures = int(*o.ConsecutiveFailures)
		}
		base = DurationOr(o.BaseEjectionTime, base)
		if o.MaxEjectionPercent != nil {
			pct = *o.MaxEjectionPercent
		}
	}
	return failures, base, float64(pct) / 100
}
