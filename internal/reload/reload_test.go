package reload

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 10)
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Watch(ctx, path, []byte("one"), hup, slog.New(slog.DiscardHandler), func(data []byte, err error) {
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(data)
	})
	expect := func(want string) {
		t.Helper()
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("applied %q, want %q", g, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing applied, want %q", want)
		}
	}
	none := func(why string) {
		t.Helper()
		select {
		case g := <-got:
			t.Fatalf("applied %q: %s", g, why)
		case <-time.After(3 * debounce):
		}
	}
	none("the file did not change from the initial contents")
	for _, step := range []struct{ write, want string }{{"two", "two"}, {"three", "three"}} {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(step.write), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		expect(step.want)
	}
	if err := os.WriteFile(path, []byte("three"), 0o600); err != nil {
		t.Fatal(err)
	}
	none("rewritten with the same contents")
	hup <- os.Interrupt
	expect("three") // a signal reloads even when nothing changed
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if len(g) < 6 || g[:6] != "error:" {
			t.Fatalf("after removal applied %q, want the read error", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a removed file was not reported")
	}
}
