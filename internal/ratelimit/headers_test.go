package ratelimit

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestSetHeaders(t *testing.T) {
	cases := []struct {
		name string
		r    Result
		want http.Header
	}{
		{"allowed, both limited", Result{Allowed: true,
			Requests: Window{Limit: 60, Remaining: 59, Reset: time.Second},
			Tokens:   Window{Limit: 150000, Remaining: 149000, Reset: 400*time.Millisecond + time.Microsecond}},
			http.Header{
				"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"59"}, "X-Ratelimit-Reset-Requests": {"1s"},
				"X-Ratelimit-Limit-Tokens": {"150000"}, "X-Ratelimit-Remaining-Tokens": {"149000"}, "X-Ratelimit-Reset-Tokens": {"401ms"},
			}},
		{"denied on tokens: Retry-After rounded up", Result{RetryAfter: 6*time.Second + time.Microsecond,
			Tokens: Window{Limit: 100, Remaining: 10, Reset: 6 * time.Minute}},
			http.Header{
				"X-Ratelimit-Limit-Tokens": {"100"}, "X-Ratelimit-Remaining-Tokens": {"10"}, "X-Ratelimit-Reset-Tokens": {"6m0s"},
				"Retry-After": {"7"},
			}},
		{"denied, under a second: Retry-After 1", Result{RetryAfter: 20 * time.Millisecond,
			Requests: Window{Limit: 6000, Reset: time.Minute}},
			http.Header{
				"X-Ratelimit-Limit-Requests": {"6000"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"1m0s"},
				"Retry-After": {"1"},
			}},
		{"too large: no Retry-After", Result{TooLarge: true, Tokens: Window{Limit: 100, Remaining: 100}},
			http.Header{"X-Ratelimit-Limit-Tokens": {"100"}, "X-Ratelimit-Remaining-Tokens": {"100"}, "X-Ratelimit-Reset-Tokens": {"0s"}}},
		{"unlimited: nothing", Result{Allowed: true}, http.Header{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			SetHeaders(h, c.r)
			if !reflect.DeepEqual(h, c.want) {
				t.Errorf("got %v\nwant %v", h, c.want)
			}
		})
	}
}

func TestParseFailMode(t *testing.T) {
	for _, m := range []FailMode{FailOpen, FailClosed} {
		if got, err := ParseFailMode(m.String()); err != nil || got != m {
			t.Errorf("ParseFailMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseFailMode("ajar"); err == nil {
		t.Error("ParseFailMode(ajar): no error")
	}
}
