package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/waittest"
)

// TestForwardOnSent: OnSent runs once, when the request's last byte went to
// the target — after the client's last byte, however slowly the client and
// the target move, and before the answer — and never for an attempt given
// up on while the body was still going, though the transport ends writing
// it only later.
func TestForwardOnSent(t *testing.T) {
	const chunks, chunk = 40, 1 << 10
	for _, c := range []struct {
		name string
		// giveUp, when set, gives the attempt up this long after it starts,
		// while the client still uploads.
		giveUp time.Duration
		want   []string // the hooks, in the order they ran
	}{
		{"the target reads the body slowly, then answers", 0, []string{"sent", "first byte"}},
		{"the attempt is given up on mid-body", 5 * time.Millisecond, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var (
				mu         sync.Mutex
				order      []string
				wrote      atomic.Bool // the transport ended writing the body
				clientDone atomic.Bool
			)
			note := func(s string) {
				mu.Lock()
				order = append(order, s)
				mu.Unlock()
			}
			b := newBench(t, []string{"reads-slowly"}, func(j *Job) {
				j.WaitFirstByte = true
				// The transport's own hook, run after Forward's: once it ran,
				// the body's write is over, one way or the other.
				j.Ctx = httptrace.WithClientTrace(j.Request.Context(), &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }})
				j.OnSent = func(int) {
					note("sent")
					if !clientDone.Load() {
						t.Error("OnSent ran before the client's last byte")
					}
				}
				j.OnFirstByte = func(int, bool) { note("first byte") }
				if c.giveUp > 0 {
					j.Watch = func(ctx context.Context, _ int, giveUp func(error)) {
						go func() {
							select {
							case <-ctx.Done():
							case <-time.After(c.giveUp):
								giveUp(Timeout("given up"))
							}
						}()
					}
				}
			})
			// The client uploads a kilobyte a millisecond.
			pr, pw := io.Pipe()
			go func() {
				for i := range chunks {
					if i == chunks-1 {
						clientDone.Store(true)
					}
					if _, err := io.WriteString(pw, strings.Repeat("x", chunk)); err != nil {
						return
					}
					time.Sleep(time.Millisecond)
				}
				_ = pw.Close()
			}()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, b.front.URL+"/v1/chat/completions", pr)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if res := <-b.results; res.Committed != (c.giveUp == 0) {
				t.Fatalf("result %+v", res)
			}
			waittest.Until(t, 10*time.Second, "the transport to end writing the body", wrote.Load)
			mu.Lock()
			defer mu.Unlock()
			if strings.Join(order, ", ") != strings.Join(c.want, ", ") {
				t.Errorf("hooks ran as %v; want %v", order, c.want)
			}
		})
	}
}
