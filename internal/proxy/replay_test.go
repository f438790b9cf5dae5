package proxy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReplayBody(t *testing.T) {
	body := strings.Repeat("x", 100)
	tests := []struct {
		name  string
		make  func() *ReplayBody
		sends int    // attempts that must each send the whole body
		then  bool   // whether a further attempt may start after those
		want  string // the body each sends (default body)
	}{
		{
			name: "whole body read while scanning",
			make: func() *ReplayBody {
				b := NewReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 0)
				b.SetWhole([]byte(body))
				return b
			},
			sends: 3, then: true,
		},
		{name: "held whole", make: func() *ReplayBody { return WholeBody([]byte(body)) }, sends: 3, then: true},
		{
			name:  "rest recorded within the retry buffer",
			make:  func() *ReplayBody { return NewReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 60) },
			sends: 3, then: true,
		},
		{
			name:  "rest larger than the retry buffer",
			make:  func() *ReplayBody { return NewReplayBody([]byte(body[:40]), strings.NewReader(body[40:]), 59) },
			sends: 1, then: false,
		},
		{
			name: "no body",
			make: func() *ReplayBody {
				b := NewReplayBody(nil, strings.NewReader("never read"), 0)
				b.SetEmpty()
				return b
			},
			sends: 3, then: true, want: "-",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := body
			if tc.want == "-" {
				want = ""
			}
			b := tc.make()
			for i := range tc.sends {
				rc, ok := b.Next()
				if !ok {
					t.Fatalf("attempt %d refused", i+1)
				}
				// Small reads, as a transport copying into a nearly full buffer does.
				got, err := io.ReadAll(io.LimitReader(struct{ io.Reader }{rc}, 1<<20))
				if err != nil || string(got) != want {
					t.Fatalf("attempt %d sent %d bytes (%v), want the %d-byte body", i+1, len(got), err, len(want))
				}
				_ = rc.Close()
			}
			if _, ok := b.Next(); ok != tc.then || b.CanReplay() != tc.then {
				t.Fatalf("after %d attempts: next %v, canReplay %v, want %v", tc.sends, ok, b.CanReplay(), tc.then)
			}
		})
	}
}

func TestReplayBodyDetach(t *testing.T) {
	b := NewReplayBody([]byte("head"), strings.NewReader("rest"), 100)
	first, _ := b.Next()
	if _, ok := b.Next(); !ok {
		t.Fatal("second attempt refused")
	}
	if _, err := first.Read(make([]byte, 8)); !errors.Is(err, errDetached) {
		t.Fatalf("an earlier attempt's reader read on after a newer one started: %v", err)
	}
	b.Detach()
	whole := WholeBody([]byte("{}"))
	rc, _ := whole.Next()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil || buf.String() != "{}" {
		t.Fatalf("whole body read %q, %v", buf.String(), err)
	}
}

func TestReplayBodyClientError(t *testing.T) {
	broken := errors.New("connection reset")
	b := NewReplayBody([]byte("he"), io.MultiReader(strings.NewReader("ad"), iotest.ErrReader(broken)), 100)
	rc, _ := b.Next()
	if _, err := io.ReadAll(rc); !errors.Is(err, broken) {
		t.Fatalf("read %v, want the client's error", err)
	}
	if !errors.Is(b.ClientError(), broken) || b.CanReplay() {
		t.Fatalf("ClientError %v, CanReplay %v", b.ClientError(), b.CanReplay())
	}
	if _, ok := b.Next(); ok {
		t.Fatal("a body the client broke was sent again")
	}
}

// closedAfterEOF is a client's body as net/http serves it: the last bytes come
// with io.EOF, and once the server closed it (as it does when the answer
// starts) a read fails.
type closedAfterEOF struct {
	data string
	done bool
}

func (c *closedAfterEOF) Read(p []byte) (int, error) {
	if c.done {
		return 0, errors.New("http: invalid Read on closed Body")
	}
	c.done = true
	return copy(p, c.data), io.EOF
}

// TestReplayBodyEnded: once the client's body ended, reading on (the
// transport checks for bytes past the length after the last one) does not
// touch the client's body again, which its server may have closed meanwhile:
// that read failing made the transport close the upstream connection
// mid-answer.
func TestReplayBodyEnded(t *testing.T) {
	b := NewReplayBody(nil, &closedAfterEOF{data: `{"model":"m"}`}, 100)
	rc, _ := b.Next()
	buf := make([]byte, 64)
	if n, err := rc.Read(buf); n != 13 || !errors.Is(err, io.EOF) {
		t.Fatalf("first read %d, %v", n, err)
	}
	for i := range 2 {
		if n, err := rc.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("read %d past the end: %d, %v; want io.EOF", i+1, n, err)
		}
	}
	if b.ClientError() != nil || !b.CanReplay() {
		t.Fatalf("ClientError %v, CanReplay %v", b.ClientError(), b.CanReplay())
	}
	again, _ := b.Next()
	if got, err := io.ReadAll(again); err != nil || string(got) != `{"model":"m"}` {
		t.Fatalf("replay sent %q, %v", got, err)
	}
}
