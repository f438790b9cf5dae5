#!/usr/bin/env bash
# Builds the developer tools kvgate's checks need from the Go module proxy, once,
# into a cache outside the repository, and prints the folder that holds them.
set -euo pipefail

GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
CONTROLLER_GEN_VERSION=${CONTROLLER_GEN_VERSION:-v0.20.1}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
TOOLS_DIR=${KVGATE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/tools}
mkdir -p "$TOOLS_DIR"

lint="$TOOLS_DIR/golangci-lint-$GOLANGCI_LINT_VERSION"
if [ ! -x "$lint" ]; then
  echo "building golangci-lint $GOLANGCI_LINT_VERSION into $TOOLS_DIR (once; a few minutes)" >&2
  tmp=$(mktemp -d)
  GOBIN="$tmp" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" >&2
  mv "$tmp/golangci-lint" "$lint"
  rmdir "$tmp"
fi
ln -sf "$lint" "$TOOLS_DIR/golangci-lint"

# controller-gen writes the CRD and the deep-copy functions from api/ (make generate).
cgen="$TOOLS_DIR/controller-gen-$CONTROLLER_GEN_VERSION"
if [ ! -x "$cgen" ]; then
  echo "building controller-gen $CONTROLLER_GEN_VERSION into $TOOLS_DIR (once)" >&2
  tmp=$(mktemp -d)
  GOBIN="$tmp" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION" >&2
  mv "$tmp/controller-gen" "$cgen"
  rmdir "$tmp"
fi
ln -sf "$cgen" "$TOOLS_DIR/controller-gen"

# helm renders the chart for its server-side dry-run test (not in Debian's archive).
helm="$TOOLS_DIR/helm-$HELM_VERSION"
if [ ! -x "$helm" ]; then
  echo "building helm $HELM_VERSION into $TOOLS_DIR (once; a few minutes)" >&2
  tmp=$(mktemp -d)
  GOBIN="$tmp" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mv "$tmp/helm" "$helm"
  rmdir "$tmp"
fi
ln -sf "$helm" "$TOOLS_DIR/helm"
echo "$TOOLS_DIR"
