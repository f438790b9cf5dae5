package telemetry

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMetricsDocumented: every kvgate_* metric name in the code (gateway, picker,
// global router, auth, rate limiter) appears in docs/metrics.md.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`"(kvgate_[a-z0-9_]+)"`)
	found := map[string]string{}
	for _, root := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range name.FindAllStringSubmatch(string(src), -1) {
				found[m[1]] = path
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(found) < 40 {
		t.Fatalf("found only %d metric names in the code: the scan is broken", len(found))
	}
	for n, path := range found {
		if !regexp.MustCompile("`" + n + "`").Match(doc) {
			t.Errorf("%s (%s) is not documented in docs/metrics.md", n, path)
		}
	}
}
