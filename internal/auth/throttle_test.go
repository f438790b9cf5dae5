package auth_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/auth"
	"github.com/kvgate/kvgate/internal/promtest"
)

// TestThrottle: past ThrottleFailures refusals within ThrottleWindow, a
// client address is refused 429 with Retry-After before its credentials are
// looked at — a good key too — until the window ends; other addresses, and
// the same IPv6 host's other ports and its /64, are counted apart or
// together as they should be.
func TestThrottle(t *testing.T) {
	clock := newClock()
	a, reg := newAuth(t, apiKeyConfig(), clock)
	try := func(client, key string) (auth.Identity, *auth.Error) {
		id, err := a.AuthenticateFrom(http.Header{"Authorization": {"Bearer " + key}}, client)
		var ae *auth.Error
		if err != nil && !errors.As(err, &ae) {
			t.Fatalf("error %T %v", err, err)
		}
		return id, ae
	}
	const attacker = "203.0.113.7:40000"
	for i := range auth.ThrottleFailures {
		if _, ae := try(fmt.Sprintf("203.0.113.7:%d", 40000+i), "sk-wrong"); ae == nil || ae.Reason != auth.ReasonUnknownKey {
			t.Fatalf("failure %d: %v", i, ae)
		}
	}
	clock.Advance(20 * time.Second)
	for _, tc := range []struct {
		name, client, key string
		want              auth.Reason // "" authenticated
	}{
		{"past the bound, a wrong key", attacker, "sk-wrong", auth.ReasonThrottled},
		{"past the bound, a good key", attacker, keyAcme, auth.ReasonThrottled},
		{"another address", "203.0.113.8:1", keyAcme, ""},
		{"another address, a wrong key", "203.0.113.8:1", "sk-wrong", auth.ReasonUnknownKey},
		{"no address known", "", keyAcme, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ae := try(tc.client, tc.key)
			switch {
			case tc.want == "" && ae != nil:
				t.Fatalf("refused: %v", ae)
			case tc.want == "":
			case ae == nil || ae.Reason != tc.want:
				t.Fatalf("got %v, want %s", ae, tc.want)
			case tc.want == auth.ReasonThrottled:
				if ae.StatusCode() != http.StatusTooManyRequests || ae.RetryAfterSeconds() != 40 || ae.Challenge() != "" || ae.Type() != "rate_limit_error" {
					t.Errorf("status %d, Retry-After %d, challenge %q, type %s; want 429 after 40 s, no challenge", ae.StatusCode(), ae.RetryAfterSeconds(), ae.Challenge(), ae.Type())
				}
			}
		})
	}
	if got := promtest.Value(t, reg, "kvgate_auth_requests_total", "method", "none", "result", "throttled"); got != 2 {
		t.Errorf("kvgate_auth_requests_total{result=throttled} = %v, want 2", got)
	}
	clock.Advance(40 * time.Second)
	if _, ae := try(attacker, keyAcme); ae != nil {
		t.Errorf("once the window ended: %v", ae)
	}

	t.Run("no credentials do not count", func(t *testing.T) {
		for range 2 * auth.ThrottleFailures {
			if _, err := a.AuthenticateFrom(http.Header{}, "198.51.100.1:1"); err == nil {
				t.Fatal("served without credentials")
			}
		}
		if _, ae := try("198.51.100.1:1", keyAcme); ae != nil {
			t.Errorf("throttled: %v", ae)
		}
	})

	t.Run("IPv6 counts by /64", func(t *testing.T) {
		for i := range auth.ThrottleFailures {
			_, _ = try(fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1), "sk-wrong")
		}
		if _, ae := try("[2001:db8:1:2:ffff::1]:443", keyAcme); ae == nil || ae.Reason != auth.ReasonThrottled {
			t.Errorf("the same /64: %v", ae)
		}
		if _, ae := try("[2001:db8:1:3::1]:443", keyAcme); ae != nil {
			t.Errorf("another /64: %v", ae)
		}
	})
}

// TestThrottleBounded: a flood of failures from ever new addresses, within
// one window, leaves the table at ThrottleAddresses.
func TestThrottleBounded(t *testing.T) {
	clock := newClock()
	a, _ := newAuth(t, apiKeyConfig(), clock)
	for i := range 3 * auth.ThrottleAddresses {
		_, _ = a.AuthenticateFrom(http.Header{"Authorization": {"Bearer sk-wrong"}}, fmt.Sprintf("10.%d.%d.%d:1", i>>16, i>>8&255, i&255))
	}
	if n := auth.ThrottleTableSize(a); n > auth.ThrottleAddresses {
		t.Errorf("%d addresses tracked, at most %d", n, auth.ThrottleAddresses)
	}
}
