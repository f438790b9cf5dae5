#!/usr/bin/env bash
# make demo: what the simulator does, measured.
set -euo pipefail
BIN=${1:-bin/kvgate}
echo "== simulated deployments (virtual time): latency and throughput per GPU and model size"
"$BIN" sim calibrate
