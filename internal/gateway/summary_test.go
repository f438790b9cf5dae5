package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestSummary: the load summary counts the window's requests and errors per
// scheduler, reads a TTFT quantile from them, and sees the ready endpoints.
func TestSummary(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, gatewayConfig(scheduler("llama", llama, a), scheduler("qwen", qwen, "127.0.0.1:1")))
	waittest.Until(t, 5*time.Second, "the endpoint scraped", func() bool { return g.fleet.Snapshot([]string{a})[0].Scraped })
	for range 5 {
		post(t, base, chat(llama, `"stream":true`)) // streamed: their first bytes are TTFTs
	}
	call(t, "POST", base+"/v1/chat/completions", chat(qwen)) // nothing listens: 502, an error
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/summary", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	var s Summary
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Models) != 2 {
		t.Fatalf("models %+v", s.Models)
	}
	l, q := s.Models[0], s.Models[1]
	if l.Model != llama || l.ReadyEndpoints != 1 || l.Endpoints != 1 || l.Requests != 5 || l.ErrorRate != 0 || l.TTFTSamples != 5 || l.TTFTP95Seconds <= 0 {
		t.Errorf("llama: %+v", l)
	}
	if q.Model != qwen || q.ReadyEndpoints != 0 || q.Requests != 1 || q.ErrorRate != 1 {
		t.Errorf("qwen: %+v", q)
	}
}

// TestRecentWindow: old buckets leave the window, and the quantile comes from
// the bins within 25%.
func TestRecentWindow(t *testing.T) {
	var r recent
	t0 := time.Unix(1_000_000, 0)
	for i := range 100 {
		r.ttft(t0, time.Duration(i+1)*time.Millisecond*10) // 10 ms .. 1 s
		r.result(t0, "200")
	}
	r.result(t0, "502")
	r.result(t0, "429")
	w := r.read(t0.Add(time.Second))
	if w.total != 102 || w.errors != 1 || w.shed != 1 || w.ttftCount != 100 {
		t.Fatalf("window %+v", w)
	}
	if p95 := w.ttftQuantile(0.95); p95 < 0.95 || p95 > 0.95*1.25 {
		t.Errorf("p95 %.3f s, want about 0.95", p95)
	}
	if later := r.read(t0.Add(recentWindow + recentBucket)); later.total != 0 || later.ttftCount != 0 {
		t.Errorf("after the window: %+v", later)
	}
}
