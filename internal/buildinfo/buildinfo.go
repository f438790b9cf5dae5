// Package buildinfo reports what binary is running.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time (-ldflags "-X github.com/kvgate/kvgate/internal/buildinfo.Version=v0.1.0");
// without it the module version or VCS revision embedded by the Go toolchain is used.
var Version = ""

// String describes the build in one line.
func String() string {
	v, rev, dirty := Version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	if rev != "" {
		v += " (" + rev + ")"
	}
	return fmt.Sprintf("kvgate %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
