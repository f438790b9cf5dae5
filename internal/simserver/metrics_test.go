package simserver

import (
	"net/http"
	"testing"
)

// kvgate_sim_scrapes_total counts every /metrics request, the one reading it
// included, failed ones too, in every dialect (a fresh TGI, which exports none of
// its own series, as well).
func TestScrapesCounter(t *testing.T) {
	for _, d := range []Dialect{DialectVLLM, DialectTGI} {
		t.Run(string(d), func(t *testing.T) {
			s, base := startServer(t, Options{Dialect: d})
			for want := 1.0; want <= 3; want++ {
				if got := value(t, scrape(t, base), SimScrapes); got != want {
					t.Fatalf("scrape %v: %s = %v", want, SimScrapes, got)
				}
			}
			if err := s.SetFaults(Faults{MetricsErrorStatus: http.StatusServiceUnavailable}); err != nil {
				t.Fatal(err)
			}
			resp, err := http.Get(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("faulty /metrics answered %d", resp.StatusCode)
			}
			if err := s.SetFaults(Faults{}); err != nil {
				t.Fatal(err)
			}
			if got := value(t, scrape(t, base), SimScrapes); got != 5 {
				t.Errorf("after a failed scrape: %s = %v, want 5", SimScrapes, got)
			}
			if got := s.Scrapes(); got != 5 {
				t.Errorf("Scrapes() = %d, want 5", got)
			}
		})
	}
}
