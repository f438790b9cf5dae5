#!/usr/bin/env bash
# Prints the path of a redis-server binary for the rate limiter's tests
# (internal/ratelimit start their own on a loopback port), installing Debian's
# redis-server package when there is none and we are root:
#
#   export KVGATE_REDIS_SERVER="$(hack/redis.sh)"
#
# KVGATE_REDIS_SERVER, when already set, is checked and printed as it is.
# Without a binary (not root, or no apt-get) it fails with a message, prints
# nothing, and the tests that need Redis skip.
set -euo pipefail

die() { echo "redis: $*" >&2; exit 1; }

# runs: the binary is there and reports a version (captured, not piped into
# grep -q: with pipefail an early grep exit fails the pipe).
runs() {
  local out
  out=$("$1" --version 2>/dev/null) && [[ $out == "Redis server v="* ]]
}

if [ -n "${KVGATE_REDIS_SERVER:-}" ]; then
  runs "$KVGATE_REDIS_SERVER" || die "KVGATE_REDIS_SERVER=$KVGATE_REDIS_SERVER is not a redis-server that runs"
  echo "$KVGATE_REDIS_SERVER"
  exit 0
fi

if bin=$(command -v redis-server) && runs "$bin"; then
  echo "$bin"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "no redis-server on PATH; install Debian's redis-server package (apt-get install redis-server) or set KVGATE_REDIS_SERVER"
command -v apt-get >/dev/null || die "no redis-server on PATH and no apt-get to install it; set KVGATE_REDIS_SERVER"
echo "redis: installing redis-server from Debian's packages (once)" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists may be missing (slim images) or stale: update once and retry.
if ! apt-get install -y -q --no-install-recommends redis-server >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends redis-server >/dev/null
fi
bin=$(command -v redis-server) && runs "$bin" || die "apt-get installed redis-server, but no working redis-server is on PATH"
echo "$bin"
