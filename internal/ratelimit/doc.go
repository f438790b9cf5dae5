// Package ratelimit enforces limits per tenant and model in requests per minute
// (RPM) and tokens per minute (TPM), shared by every `kvgate global` replica
// through Redis.
//
// # Algorithm
//
// Each Key has two GCRA (generic cell rate algorithm) states, one per
// dimension. A limit of L per minute has the emission interval T = 60 s / L; the
// state is the theoretical arrival time TAT, the instant by which everything
// taken so far would have been paid for at the rate L. A check of cost n (one
// request; n tokens) conforms when max(TAT, now) + n·T − now ≤ τ, and then sets
// TAT to that sum.
//
// The tolerance τ is one minute, i.e. the burst is the whole per-minute limit:
// a key idle for a minute may spend a minute's allowance at once, and over any
// span s it gets at most L·(1 + s/60 s). We chose this because "L per minute"
// is what tenants are sold and what x-ratelimit-remaining-* reports at rest
// (the full limit): a smaller burst would refuse a client that sends its 60
// allowed requests in the first second of a minute. Past the burst the rate is
// smooth, one unit per T, with no window edges at which 2L could pass.
//
// Both dimensions are checked by one Lua script (EVALSHA, falling back to
// EVAL), so a request denied on either takes nothing from the other. Time is
// Redis's own (TIME), so replicas with skewed clocks agree. The keys are
// kvgate:rl:{tenant:model}:req and :tok; the braces are a Redis Cluster hash
// tag, putting both keys of a check in one slot. A key expires when its TAT
// passes (PEXPIRE), since a missing key and an idle one mean the same.
//
// # Reservations and the overshoot bound
//
// A request's tokens are known only when its response ends. Reserve takes an
// estimate up front, which the caller makes an upper bound of the completion:
// the prompt's estimated tokens plus max_tokens. Reconcile then moves the token
// TAT by (actual − reserved)·T: a refund when fewer were used (never taking the
// TAT before now, so unused allowance cannot pile up beyond the burst), a charge
// when more were, which is applied even past the limit.
//
// Every admission is decided against a TAT that includes every reservation
// admitted and every reconciliation made so far. So the tokens actually served
// can exceed GCRA's bound only by the under-reservations, max(0, actual −
// reserved), of requests not yet reconciled. For one streaming response that is
// its own reservation error, which max_tokens leaves to the prompt estimate
// alone; once it reconciles, the excess is owed and the tenant's next requests
// wait excess·T for it. Charging only afterwards (Envoy AI Gateway) admits
// every request while any allowance is left, each overshooting by its whole
// usage. The price of reserving is that max_tokens holds allowance until the
// response ends.
//
// # Redis unavailable
//
// A request waits for Redis's decision at least Options.Timeout (50 ms) and,
// when Redis has been answering slowly (a busy node, a loaded Redis), up to
// the retransmission timeout of RFC 6298 over the observed answer times
// (smoothed time + the larger of itself and 4 deviations), at most Options.MaxTimeout. A request that
// waited that long is decided by the fail mode, alone: one slow answer does
// not take Redis out of use. Redis is "down" after an error, or a call it has
// not answered in MaxTimeout: decisions then skip it for
// Options.RetryInterval, then one request at a time tries it again, and the
// first answer ends the outage.
// Meanwhile FailOpen decides with a local GCRA of the same semantics, results
// marked Degraded; each replica enforces the limits on its own, so N replicas
// may admit up to N times a limit between them, and each starts with a full
// burst. What they admit is not written back to Redis on recovery. FailClosed
// denies with ErrUnavailable (a 503 for the caller). Outages are logged a few
// lines at a time and counted in Metrics.
package ratelimit
