package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestParseAccessLog(t *testing.T) {
	for _, tc := range []struct {
		spec  string
		every uint64
		bad   bool
	}{
		{"", 0, false}, {"off", 0, false}, {"on", 1, false}, {"sampled=1", 1, false}, {"sampled=50", 50, false},
		{"sampled=0", 0, true}, {"sampled=", 0, true}, {"sampled=-2", 0, true}, {"yes", 0, true}, {"sampled=x", 0, true},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			every, err := ParseAccessLog(tc.spec)
			if every != tc.every || (err != nil) != tc.bad {
				t.Errorf("ParseAccessLog(%q) = %d, %v; want %d, error %v", tc.spec, every, err, tc.every, tc.bad)
			}
		})
	}
}

// TestAccessLogSampled: sampled=N logs one request in N, and every failure.
func TestAccessLogSampled(t *testing.T) {
	for _, tc := range []struct {
		spec             string
		requests, failed int
		want             int
	}{
		{"on", 10, 0, 10},
		{"sampled=5", 20, 0, 4},
		{"sampled=5", 20, 3, 3 + 4}, // the failures, then one in 5 of all
		{"off", 10, 2, 0},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			var buf bytes.Buffer
			al, err := NewAccessLog(slog.New(slog.NewJSONHandler(&buf, nil)), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.requests {
				e := &Entry{RequestID: "r", Model: "m", Status: 200, Duration: time.Millisecond, TTFT: time.Microsecond}
				if i < tc.failed {
					e.Status, e.Failed = 503, true
				}
				al.Log(context.Background(), e)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 {
				lines = nil
			}
			if len(lines) != tc.want {
				t.Fatalf("%d lines, want %d", len(lines), tc.want)
			}
			for _, l := range lines {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatal(err)
				}
				for _, k := range []string{"request_id", "gen_ai.request.model", "http.response.status_code", "duration", "gen_ai.server.time_to_first_token",
					"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "kvgate.retries", "kvgate.scheduler", "kvgate.endpoint"} {
					if _, ok := m[k]; !ok {
						t.Errorf("line %s lacks %s", l, k)
					}
				}
			}
		})
	}
}
