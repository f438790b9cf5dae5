package auth_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/auth"
)

func TestHashKey(t *testing.T) {
	// SHA-256 of "abc", FIPS 180-2 appendix B.1.
	const want = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := auth.HashKey("abc"); got != want {
		t.Fatalf("HashKey(abc) = %s, want %s", got, want)
	}
	// The shell recipe in the documentation gives the same.
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	out, err := exec.Command("sh", "-c", `KEY=abc; printf %s "$KEY" | sha256sum | awk '{print "sha256:" $1}'`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("shell recipe gives %s, want %s", got, want)
	}
}
