#!/usr/bin/env bash
# Prints, at the end of make test, which real parts KVGATE_SKIP left out, so a
# green run without them never reads as a full one.
set -euo pipefail
skip=${KVGATE_SKIP:-}
skip=${skip// /}
[ -n "$skip" ] || exit 0
declare -A what=(
  [kube]="the Kubernetes tests (kube-apiserver and etcd: controller, status, CRD, InferencePool, BBR ConfigMaps, Helm dry run)"
  [helm]="the Helm chart's server-side dry run"
  [redis]="the Redis-backed tests (shared rate limits, fail-open/closed)"
  [chromium]="the fleet page's headless-browser test"
)
echo "make test: NOT a full run. KVGATE_SKIP=$skip skipped:" >&2
IFS=, read -r -a parts <<<"$skip"
for p in "${parts[@]}"; do
  if [ "$p" = all ]; then
    for k in kube helm redis chromium; do echo "  - ${what[$k]}" >&2; done
  else
    echo "  - ${what[$p]:-$p}" >&2
  fi
done
