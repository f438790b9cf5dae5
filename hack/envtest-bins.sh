#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that controller-runtime's envtest
# needs from the Go module proxy, once, into a cache outside the repository, and
# prints the folder that holds them (last line of stdout):
#
#   export KUBEBUILDER_ASSETS="$(hack/envtest-bins.sh)"
#
# Neither binary can be `go install`ed: k8s.io/kubernetes points its k8s.io/*
# staging modules at ./staging/... with replace directives, and etcd's server
# module replaces its sibling modules with ../paths. So each is built inside a
# throw-away module that requires it; for kube-apiserver that module also pins
# every staging module named in kubernetes' go.mod to the matching v0.Y.Z tag.
# The first run takes ~9 minutes on 2 cores (kube-apiserver is big); later runs only
# check that both binaries are there and answer --version.
set -euo pipefail

K8S_VERSION=${ENVTEST_K8S_VERSION:-v1.35.4}   # k8s.io/kubernetes; matches k8s.io/apimachinery v0.35.4 in go.mod
ETCD_VERSION=${ENVTEST_ETCD_VERSION:-v3.6.16} # go.etcd.io/etcd/server/v3; kubernetes 1.35 is tested against etcd 3.6
# How long each first build took on a 2-core machine (printed while it runs).
KUBE_TIME="4.5-8 min on 2 cores, longer on a busy machine" ETCD_TIME="~1.5 min on 2 cores"
ASSETS_DIR=${KVGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate}/envtest/$K8S_VERSION-$ETCD_VERSION

progress=$(cd "$(dirname "$0")" && pwd)/progress.sh

die() { echo "envtest-bins: $*" >&2; exit 1; }

# ready: both binaries exist, run, and report the versions this folder is named after.
ready() {
  [ -x "$ASSETS_DIR/kube-apiserver" ] && [ -x "$ASSETS_DIR/etcd" ] || return 1
  # (captured, not piped into grep -q: with pipefail an early grep exit fails the pipe)
  local out
  out=$("$ASSETS_DIR/kube-apiserver" --version 2>/dev/null) && [[ $out == *"Kubernetes $K8S_VERSION"* ]] || return 1
  out=$("$ASSETS_DIR/etcd" --version 2>/dev/null) && [[ $out == *"etcd Version: ${ETCD_VERSION#v}"* ]] || return 1
}

if ready; then
  echo "$ASSETS_DIR"
  exit 0
fi

case $K8S_VERSION in
  v1.*.*) STAGING_VERSION=v0.${K8S_VERSION#v1.} ;; # k8s.io/kubernetes v1.Y.Z <-> k8s.io/api etc. v0.Y.Z
  *) die "ENVTEST_K8S_VERSION must look like v1.Y.Z, got '$K8S_VERSION'" ;;
esac
command -v go >/dev/null || die "go is not on PATH"
mkdir -p "$ASSETS_DIR"

# One build at a time per folder; whoever waited finds the binaries ready.
if command -v flock >/dev/null; then
  exec 9>"$ASSETS_DIR/.lock"
  if ! flock -n 9; then
    echo "envtest-bins: another build into $ASSETS_DIR is running; waiting for it" >&2
    flock 9
  fi
  if ready; then
    echo "$ASSETS_DIR"
    exit 0
  fi
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-envtest.XXXXXX")
cleanup() {
  local rc=$?
  rm -rf "$tmp"
  rm -f "$ASSETS_DIR/.kube-apiserver.$$" "$ASSETS_DIR/.etcd.$$"
  [ "$rc" = 0 ] || echo "envtest-bins: FAILED (exit $rc) building into $ASSETS_DIR; see the messages above" >&2
}
trap cleanup EXIT

# Module mode in throw-away modules, no cgo, and at most two compiles at once so
# the 2-core machine keeps its memory.
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 GOMAXPROCS=2
build_flags=(-p 2 -trimpath)

build_kube_apiserver() {
  echo "envtest-bins: building kube-apiserver $K8S_VERSION (staging modules $STAGING_VERSION) into $ASSETS_DIR (once; $KUBE_TIME)" >&2
  local mod="$tmp/kube-apiserver" gomod
  mkdir -p "$mod"
  gomod=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || die "the Go module proxy did not give k8s.io/kubernetes@$K8S_VERSION"
  (
    cd "$mod"
    go mod init kvgate.local/envtest/kube-apiserver >/dev/null 2>&1
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    # kubernetes' own replace directives: staging modules (./staging/src/k8s.io/X)
    # become X@v0.Y.Z; any that point at a released version are copied as they are.
    replaces "$gomod" | while read -r old new newver; do
      case $new in
        ./staging/*) go mod edit -replace="$old=${old%@*}@$STAGING_VERSION" ;;
        ./* | ../* | /*) die "unexpected local replace in k8s.io/kubernetes@$K8S_VERSION go.mod: $old => $new" ;;
        *) go mod edit -replace="$old=$new${newver:+@$newver}" ;;
      esac
    done
    grep -q "=> k8s.io/api $STAGING_VERSION" go.mod || die "found no staging replace directives in $gomod"
    # Stamp the version as kubernetes' own build does (hack/lib/version.sh); left
    # out, the binary calls itself v0.0.0-master and envtest clients see that.
    local ld="-s -w" minor=${K8S_VERSION#v1.} p
    minor=${minor%%.*}
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    "$progress" "building kube-apiserver" "$KUBE_TIME" \
      go build "${build_flags[@]}" -ldflags "$ld" -o "$ASSETS_DIR/.kube-apiserver.$$" k8s.io/kubernetes/cmd/kube-apiserver >&2
  )
  "$ASSETS_DIR/.kube-apiserver.$$" --version >&2 || die "the kube-apiserver just built does not run"
  mv -f "$ASSETS_DIR/.kube-apiserver.$$" "$ASSETS_DIR/kube-apiserver"
}

# Prints the replace directives of a go.mod file, one a line, as
# "old[@version] new [version]".
replaces() {
  awk '
    { sub(/\/\/.*/, "") }
    /^replace[ \t]*\($/ { block = 1; next }
    block && /^\)/ { block = 0; next }
    /^replace[ \t]/ { sub(/^replace[ \t]+/, ""); block1 = 1 }
    (block || block1) && /=>/ {
      split($0, side, "=>"); n = split(side[1], o, " "); split(side[2], w, " ")
      print (n > 1 ? o[1] "@" o[2] : o[1]), w[1], w[2]
    }
    { block1 = 0 }
  ' "$1"
}

build_etcd() {
  echo "envtest-bins: building etcd $ETCD_VERSION into $ASSETS_DIR (once; $ETCD_TIME)" >&2
  local mod="$tmp/etcd"
  mkdir -p "$mod"
  (
    cd "$mod"
    go mod init kvgate.local/envtest/etcd >/dev/null 2>&1
    go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    cat >main.go <<'EOF'
// The etcd server, as etcd's own server/main.go builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    "$progress" "building etcd" "$ETCD_TIME" go build "${build_flags[@]}" -ldflags "-s -w" -o "$ASSETS_DIR/.etcd.$$" . >&2
  )
  "$ASSETS_DIR/.etcd.$$" --version >&2 || die "the etcd just built does not run"
  mv -f "$ASSETS_DIR/.etcd.$$" "$ASSETS_DIR/etcd"
}

start=$SECONDS
build_etcd
build_kube_apiserver
ready || die "built binaries in $ASSETS_DIR do not report $K8S_VERSION / $ETCD_VERSION"
echo "envtest-bins: done in $((SECONDS - start))s" >&2
echo "$ASSETS_DIR"
