#!/usr/bin/env bash
# Runs a command and, while it runs, prints a line to stderr every
# PROGRESS_EVERY seconds (default 30) saying what is still running, for how
# long, and how long it usually takes — so that a long first build is not
# mistaken for a hang:
#
#   hack/progress.sh "building kvgate" "first time ~6 min on 2 cores, then seconds" go build ./cmd/kvgate
#
# The command's output and exit status pass through unchanged.
set -uo pipefail

[ $# -ge 3 ] || { echo "usage: $0 WHAT EXPECTED COMMAND [ARG...]" >&2; exit 2; }
what=$1 expected=$2
shift 2
every=${PROGRESS_EVERY:-30}
start=$(date +%s)

"$@" &
pid=$!
# Ctrl-C or a CI cancel reaches the command too.
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM

(
  # sleep in the background and wait for it: a trap interrupts wait at once,
  # where it would wait for a foreground sleep to end.
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$every" &
    nap=$!
    wait "$nap"
    s=$(( $(date +%s) - start ))
    printf '  … %s: still running after %dm%02ds (%s)\n' "$what" $((s / 60)) $((s % 60)) "$expected" >&2
  done
) &
ticker=$!

wait "$pid"
rc=$?
kill -TERM "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
exit $rc
