package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how Require ended the test instead of
// ending this one.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(f string, a ...any) {
	r.skipped = f
	panic(r)
}
func (r *recorder) Fatalf(f string, a ...any) {
	r.failed = f
	panic(r)
}

func run(t *testing.T, p Part) (got string, r *recorder) {
	r = &recorder{TB: t}
	defer func() {
		if v := recover(); v != nil && v != r {
			panic(v)
		}
	}()
	return Require(r, p), r
}

func TestRequire(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "bin")
	if err := os.WriteFile(present, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	p := Part{Name: "thing", Env: "KVGATE_TESTENV_THING", What: "a thing", How: "build it"}
	withCmd := p
	withCmd.Cmd = "kvgate-no-such-command"
	onPath := p
	onPath.Cmd = "sh"
	for _, c := range []struct {
		name       string
		part       Part
		env, skip  string
		want       string
		wantSkip   bool
		wantFailed bool
	}{
		{name: "set and present", part: p, env: present, want: present},
		{name: "unset fails", part: p, wantFailed: true},
		{name: "unset fails though another part is skipped", part: p, skip: "kube,redis", wantFailed: true},
		{name: "unset skips when named", part: p, skip: "kube, thing", wantSkip: true},
		{name: "unset skips with all", part: p, skip: "all", wantSkip: true},
		{name: "set but missing fails", part: p, env: filepath.Join(dir, "nope"), wantFailed: true},
		{name: "not on PATH fails", part: withCmd, wantFailed: true},
		{name: "found on PATH", part: onPath, want: "sh"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(p.Env, c.env)
			t.Setenv(SkipVar, c.skip)
			got, r := run(t, c.part)
			if (r.skipped != "") != c.wantSkip || (r.failed != "") != c.wantFailed {
				t.Fatalf("skipped %q failed %q; want skip %v fail %v", r.skipped, r.failed, c.wantSkip, c.wantFailed)
			}
			if c.want != "" && !strings.HasSuffix(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestKvgatePerCheckout: the binary Kvgate builds lives in a folder of this
// checkout's own, so that a run from another checkout (a worktree of another
// branch, with other flags) cannot replace it under this run.
func TestKvgatePerCheckout(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "kvgate")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	bin := Kvgate(t)
	if got, want := filepath.Dir(bin), binDir(root); got != want {
		t.Errorf("Kvgate built %s, want it in %s", bin, want)
	}
	for _, other := range []string{filepath.Join(filepath.Dir(root), "other-worktree"), root + "-2", "/"} {
		if binDir(other) == binDir(root) {
			t.Errorf("checkouts %s and %s share %s", root, other, binDir(root))
		}
	}
}
