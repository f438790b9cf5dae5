// Package testenv finds the real parts a test needs — a kube-apiserver and
// etcd, helm, redis-server — and decides what a test does without one: it
// fails, naming the part and how to get it, unless the user asked to run
// without that part by naming it in KVGATE_SKIP. A missing part never passes
// a run silently.
package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// SkipVar lists, comma-separated, the parts a run may do without ("kube",
// "helm", "redis", "chromium", or "all"). make test prints at its end what it skipped.
const SkipVar = "KVGATE_SKIP"

// Part is one real dependency of the tests.
type Part struct {
	Name string // as written in KVGATE_SKIP
	Env  string // the variable that points at it; make test sets it
	What string // for messages: what the tests need
	How  string // for messages: how to get it
	// Cmd, when set, is looked up on PATH if Env is unset.
	Cmd string
}

// The parts make test provides (hack/unit.sh).
var (
	Kube = Part{Name: "kube", Env: "KUBEBUILDER_ASSETS", What: "a folder with kube-apiserver and etcd",
		How: "run through make test, which builds them once (hack/envtest-bins.sh), or export KUBEBUILDER_ASSETS=$(hack/envtest-bins.sh)"}
	Helm = Part{Name: "helm", Env: "KVGATE_HELM", What: "a helm binary",
		How: "run through make test, which builds it once (hack/tools.sh), or export KVGATE_HELM=$(hack/tools.sh)/helm"}
	Redis = Part{Name: "redis", Env: "KVGATE_REDIS_SERVER", Cmd: "redis-server", What: "a redis-server binary",
		How: "run through make test (hack/redis.sh installs Debian's redis-server as root), put redis-server on PATH, or set KVGATE_REDIS_SERVER"}
)

// Chromium drives the fleet page's browser test (hack/chromium.sh).
var Chromium = Part{Name: "chromium", Env: "KVGATE_CHROMIUM", Cmd: "chromium", What: "a Chromium binary",
	How: "run through make test (hack/chromium.sh installs Debian's chromium as root), put chromium on PATH, or set KVGATE_CHROMIUM"}

// Parts are the names KVGATE_SKIP accepts, besides "all".
var Parts = []Part{Kube, Helm, Redis, Chromium}

// Require returns where p is — the value of p.Env, else p.Cmd found on PATH —
// after checking that it exists. Without it the test fails, or skips when
// KVGATE_SKIP names p.
func Require(t testing.TB, p Part) string {
	t.Helper()
	path, err := p.find()
	if err == nil {
		return path
	}
	if Skipped(os.Getenv(SkipVar), p.Name) {
		t.Skipf("%s skipped (%s=%s): %v", p.Name, SkipVar, os.Getenv(SkipVar), err)
	}
	t.Fatalf("this test needs %s: %v; %s (or set %s=%s to run without it)", p.What, err, p.How, SkipVar, p.Name)
	return ""
}

func (p Part) find() (string, error) {
	v := os.Getenv(p.Env)
	if v == "" && p.Cmd != "" {
		found, err := exec.LookPath(p.Cmd)
		if err != nil {
			return "", fmt.Errorf("%s is unset and there is no %s on PATH", p.Env, p.Cmd)
		}
		return found, nil
	}
	if v == "" {
		return "", fmt.Errorf("%s is unset", p.Env)
	}
	if _, err := os.Stat(v); err != nil {
		return "", fmt.Errorf("%s=%s: %w", p.Env, v, err)
	}
	return v, nil
}

// Skipped reports whether the KVGATE_SKIP value list names part (or "all").
func Skipped(list, part string) bool {
	names := strings.Split(list, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	return slices.Contains(names, part) || slices.Contains(names, "all")
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Kvgate builds cmd/kvgate once per test binary and returns its path, for
// tests that run kvgate as its own process. It goes to one path per user and
// checkout, replaced by a rename, so that runs do not pile up binaries in the
// temp directory, a run never executes another's half-written file, and runs
// from two checkouts (worktrees of different branches) never execute each
// other's build.
func Kvgate(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir := binDir(root)
		if buildErr = os.MkdirAll(dir, 0o700); buildErr != nil {
			return
		}
		tmp, err := os.CreateTemp(dir, "kvgate-*")
		if err != nil {
			buildErr = err
			return
		}
		_ = tmp.Close()
		out, err := exec.Command("go", "build", "-o", tmp.Name(), "github.com/kvgate/kvgate/cmd/kvgate").CombinedOutput()
		if err != nil {
			_ = os.Remove(tmp.Name())
			buildErr = fmt.Errorf("go build cmd/kvgate: %w\n%s", err, out)
			return
		}
		binPath = filepath.Join(dir, "kvgate")
		buildErr = os.Rename(tmp.Name(), binPath)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// moduleRoot is the directory of the go.mod the tests run in.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: the tests do not run inside a module")
	}
	return filepath.Dir(mod), nil
}

// binDir is where Kvgate builds the checkout at root: a folder per user and
// checkout, named by a hash of the checkout's path.
func binDir(root string) string {
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(os.TempDir(), fmt.Sprintf("kvgate-test-%d", os.Getuid()), hex.EncodeToString(sum[:8]))
}
