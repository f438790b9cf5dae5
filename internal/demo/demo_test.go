package demo

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestDemoReports(t *testing.T) {
	var out strings.Builder
	if err := Run(context.Background(), &out, Options{LoadDuration: time.Second, Rate: 4, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, want := range []string{"h100-0", "h100-1", "a10g-0", "a10g-1", "cached tokens", "LoRA", "TTFT p95", "picker round-robin:", "picker kvgate:"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	m := regexp.MustCompile(`first: TTFT (\d+) ms, 0 cached tokens;  again: TTFT (\d+) ms, (\d+) cached tokens`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("no prefix-cache line:\n%s", report)
	}
	cold, _ := strconv.Atoi(m[1])
	warm, _ := strconv.Atoi(m[2])
	cached, _ := strconv.Atoi(m[3])
	if warm >= cold || cached < 5000 {
		t.Errorf("prefix cache: cold %d ms, warm %d ms, %d cached", cold, warm, cached)
	}
	// Every request of both load phases went through the gateway and was served.
	served := regexp.MustCompile(`(?m)^\s+all\s+(\d+)\s`).FindAllStringSubmatch(report, -1)
	if len(served) != 2 {
		t.Fatalf("want two load phases:\n%s", report)
	}
	for _, m := range served {
		if n, _ := strconv.Atoi(m[1]); n == 0 {
			t.Errorf("a load phase served nothing:\n%s", report)
		}
	}
}
