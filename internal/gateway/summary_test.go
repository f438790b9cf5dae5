package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/route"
	"github.com/kvgate/kvgate/internal/simserver"
	"github.com/kvgate/kvgate/internal/waittest"
)

// TestSummary: the load summary counts the window's requests and errors per
// scheduler, reads a TTFT quantile from them, and sees the ready endpoints.
func TestSummary(t *testing.T) {
	_, a := startSim(t, llama, simserver.Options{})
	g, base := startGateway(t, gatewayConfig(scheduler("llama", llama, a), scheduler("qwen", qwen, "127.0.0.1:1")))
	waittest.Until(t, 5*time.Second, "the endpoint scraped", func() bool { return g.Snapshot([]string{a})[0].Scraped })
	for range 5 {
		post(t, base, chat(llama, `"stream":true`)) // streamed: their first bytes are TTFTs
	}
	call(t, "POST", base+"/v1/chat/completions", chat(qwen)) // nothing listens: 502, an error
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/summary", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	var s route.Summary
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
