#!/usr/bin/env bash
# Prints the path of a Chromium binary for the fleet page's browser test
# (internal/gateway TestFleetPage drives it headless), installing Debian's
# chromium package when there is none and we are root:
#
#   export KVGATE_CHROMIUM="$(hack/chromium.sh)"
#
# KVGATE_CHROMIUM, when already set, is checked and printed as it is.
# Without a binary (not root, or no apt-get) it fails with a message and
# prints nothing; the test then fails unless KVGATE_SKIP names chromium.
set -euo pipefail

die() { echo "chromium: $*" >&2; exit 1; }

# runs: the binary starts and reports a version (captured, not piped into
# grep -q: with pipefail an early grep exit fails the pipe).
runs() {
  local out
  out=$("$1" --version 2>/dev/null) && [[ $out == *Chromium* || $out == *Chrome* ]]
}

if [ -n "${KVGATE_CHROMIUM:-}" ]; then
  runs "$KVGATE_CHROMIUM" || die "KVGATE_CHROMIUM=$KVGATE_CHROMIUM is not a Chromium that runs"
  echo "$KVGATE_CHROMIUM"
  exit 0
fi

for name in chromium chromium-browser; do
  if bin=$(command -v "$name") && runs "$bin"; then
    echo "$bin"
    exit 0
  fi
done

[ "$(id -u)" = 0 ] || die "no chromium on PATH; install Debian's chromium package (apt-get install chromium) or set KVGATE_CHROMIUM"
command -v apt-get >/dev/null || die "no chromium on PATH and no apt-get to install it; set KVGATE_CHROMIUM"
echo "chromium: installing chromium from Debian's packages (once, about 100 MB)" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists may be missing (slim images) or stale: update once and retry.
if ! apt-get install -y -q --no-install-recommends chromium >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends chromium >/dev/null
fi
bin=$(command -v chromium) && runs "$bin" || die "apt-get installed chromium, but no working chromium is on PATH"
echo "$bin"
