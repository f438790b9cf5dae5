package gateway

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReplayBody(t *testing.T) {
	body := strings.Repeat("x", 100)
	tests := []struct {
		name  string
		make  func() *replayBody
		sends int  // attempts that must each send the whole body
		then  bool // whether a further attempt may start after those
	}{
		{
			name: "whole body read while scanning",
			make: func() *replayBody {
				b := newReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 0)
				b.whole = []byte(body)
				return b
			},
			sends: 3, then: true,
		},
		{
			name:  "rest recorded within the retry buffer",
			make:  func() *replayBody { return newReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 60) },
			sends: 3, then: true,
		},
		{
			name:  "rest larger than the retry buffer",
			make:  func() *replayBody { return newReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 59) },
			sends: 1, then: false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.make()
			for i := range tc.sends {
				rc, ok := b.next()
				if !ok {
					t.Fatalf("attempt %d refused", i+1)
				}
				// Small reads, as a transport copying into a nearly full buffer does.
				got, err := io.ReadAll(io.LimitReader(struct{ io.Reader }{rc}, 1<<20))
				if err != nil || string(got) != body {
					t.Fatalf("attempt %d sent %d bytes (%v), want the %d-byte body", i+1, len(got), err, len(body))
				}
				_ = rc.Close()
			}
			if _, ok := b.next(); ok != tc.then || b.canReplay() != tc.then {
				t.Fatalf("after %d attempts: next %v, canReplay %v, want %v", tc.sends, ok, b.canReplay(), tc.then)
			}
		})
	}
}

func TestReplayBodyDetach(t *testing.T) {
	b := newReplayBody([]byte("head"), strings.NewReader("rest"), 100)
	first, _ := b.next()
	if _, ok := b.next(); !ok {
		t.Fatal("second attempt refused")
	}
	if _, err := first.Read(make([]byte, 8)); !errors.Is(err, errDetached) {
		t.Fatalf("an earlier attempt's reader read on after a newer one started: %v", err)
	}
	b.detach()
	whole := newReplayBody(nil, nil, 0)
	whole.whole = []byte("{}")
	rc, _ := whole.next()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil || buf.String() != "{}" {
		t.Fatalf("whole body read %q, %v", buf.String(), err)
	}
}
