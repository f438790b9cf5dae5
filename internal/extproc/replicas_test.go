package extproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/host"
	"github.com/kvgate/kvgate/internal/redistest"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestPickersShareState: two Endpoint Pickers sharing state through Redis run
// active-active: a system prompt one of them routed goes to the same pod when
// its next request reaches the other.
func TestPickersShareState(t *testing.T) {
	r := redistest.Start(t)
	cfg := gatewayConfig(pool(startSims(t, 3, simserver.Options{Engine: sim.Config{GPU: "h100", ModelSize: "8b"}})...))
	shared := func(name string) func(*host.CoreOptions) {
		return func(o *host.CoreOptions) {
			o.SharedState = host.SharedStateOptions{Redis: r.Addr(), Cluster: "epp", Replica: name, Heartbeat: 100 * time.Millisecond}
		}
	}
	a := startServer(t, cfg, Options{}, shared("a"))
	b := startServer(t, cfg, Options{}, shared("b"))
	waittest.Until(t, 10*time.Second, "the pickers to find each other", func() bool {
		return a.gw.Replicas().Replicas == 2 && b.gw.Replicas().Replicas == 2
	})
	prompt := func(k, i int) request {
		return request{body: chatBody(llama, fmt.Sprintf("Tenant %d. ", k)+strings.Repeat("You review contracts clause by clause and cite them. ", 80)+fmt.Sprintf("Question %d.", i))}
	}
	first := map[int]string{}
	for k := range 6 {
		first[k] = a.play(t, prompt(k, 0)).destination(t)[0]
	}
	waittest.Until(t, 5*time.Second, "the decisions to reach the other picker", func() bool {
		return b.gw.Replicas().Mesh.Counters["received"] > 0
	})
	time.Sleep(50 * time.Millisecond)
	for k := range 6 {
		if got := b.play(t, prompt(k, 1)).destination(t)[0]; got != first[k] {
			t.Errorf("prompt %d: picker a sent it to %s, picker b to %s", k, first[k], got)
		}
	}
}
