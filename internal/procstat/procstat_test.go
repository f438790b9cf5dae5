package procstat

import (
	"os"
	"testing"
)

func TestSelf(t *testing.T) {
	x := 0
	for i := range 50_000_000 {
		x += i
	}
	cpu, err := CPUSeconds(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Fatalf("cpu %v, %v (x=%d)", cpu, err, x)
	}
	rss, err := RSSBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("rss %v, %v", rss, err)
	}
	if _, err := CPUSeconds(-1); err == nil {
		t.Error("no error for a missing process")
	}
}
