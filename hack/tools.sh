#!/usr/bin/env bash
# Builds the developer tools kvgate's checks need from the Go module proxy, once,
# into a cache outside the repository, and prints the folder that holds them.
set -euo pipefail

GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
CONTROLLER_GEN_VERSION=${CONTROLLER_GEN_VERSION:-v0.20.1}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
progress=$(cd "$(dirname "$0")" && pwd)/progress.sh
TOOLS_DIR=${KVGATE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/tools}
mkdir -p "$TOOLS_DIR"

# expected NAME: how long the first build of NAME took on a 2-core machine.
expected() {
  case $1 in
    golangci-lint) echo "~1.5 min on 2 cores" ;;
    controller-gen) echo "~1 min on 2 cores" ;;
    helm) echo "~2 min on 2 cores" ;;
  esac
}

# tool NAME VERSION PACKAGE: builds PACKAGE@VERSION into TOOLS_DIR/NAME-VERSION
# unless it is there, and points TOOLS_DIR/NAME at it.
tool() {
  local name=$1 version=$2 pkg=$3
  local bin="$TOOLS_DIR/$name-$version"
  if [ ! -x "$bin" ]; then
    echo "tools: building $name $version into $TOOLS_DIR (once; $(expected "$name"))" >&2
    local tmp
    tmp=$(mktemp -d)
    # Module mode: helm's go.mod must be honoured as a dependency's would be.
    GOBIN="$tmp" GOFLAGS=-mod=mod "$progress" "building $name" "$(expected "$name")" go install "$pkg@$version" >&2
    mv "$tmp/$name" "$bin"
    rmdir "$tmp"
  fi
  ln -sf "$bin" "$TOOLS_DIR/$name"
}

tool golangci-lint "$GOLANGCI_LINT_VERSION" github.com/golangci/golangci-lint/v2/cmd/golangci-lint
# controller-gen writes the CRD and the deep-copy functions from api/ (make generate).
tool controller-gen "$CONTROLLER_GEN_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen
# helm renders the chart for its server-side dry-run test (not in Debian's archive).
tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm

echo "$TOOLS_DIR"
