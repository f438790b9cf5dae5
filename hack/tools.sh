#!/usr/bin/env bash
# Builds the developer tools kvgate's checks need from the Go module proxy, once,
# into a cache outside the repository, and prints the folder that holds them.
set -euo pipefail

GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
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
echo "$TOOLS_DIR"
