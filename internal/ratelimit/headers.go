package ratelimit

import (
	"net/http"
	"strconv"
	"time"
)

// SetHeaders writes a decision's headers with OpenAI's names:
// x-ratelimit-{limit,remaining,reset}-{requests,tokens} for each limited
// dimension, and Retry-After (whole seconds, rounded up) when the request was
// denied and a retry can succeed. The reset is a duration as OpenAI writes it
// ("1s", "6m0s", "20ms"), rounded up to the millisecond.
func SetHeaders(h http.Header, r Result) {
	setWindow(h, "requests", r.Requests)
	setWindow(h, "tokens", r.Tokens)
	if !r.Allowed && r.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(ceil(r.RetryAfter, time.Second)/time.Second), 10))
	}
}

func setWindow(h http.Header, name string, w Window) {
	if w.Limit <= 0 {
		return
	}
	h.Set("x-ratelimit-limit-"+name, strconv.FormatInt(w.Limit, 10))
	h.Set("x-ratelimit-remaining-"+name, strconv.FormatInt(w.Remaining, 10))
	h.Set("x-ratelimit-reset-"+name, ceil(w.Reset, time.Millisecond).String())
}

// ceil rounds d up to a multiple of unit.
func ceil(d, unit time.Duration) time.Duration {
	if r := d % unit; r > 0 {
		d += unit - r
	}
	return d
}
