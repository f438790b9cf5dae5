#!/usr/bin/env bash
# make generate / make verify-generate: the code and manifests controller-gen
# writes from api/, and the chart's copies of them.
#
#   api/v1alpha1        -> deep-copy code, and the InferenceGatewayConfig CRD in
#                          config/crd/bases (installed by config/default) and
#                          deploy/helm/kvgate/crds (installed by helm)
#   api/inferencepool/v1 -> deep-copy code, and the InferencePool CRD in
#                          config/crd/inferencepool (optional: kubectl apply -k) and
#                          deploy/helm/kvgate/files (rendered when
#                          inferencePool.installCRD=true)
#   deploy/grafana/kvgate.json, deploy/prometheus/kvgate-rules.yaml
#                       -> the chart's copies in deploy/helm/kvgate/files (a chart
#                          cannot read files outside its folder)
#
#   hack/generate.sh            writes them all
#   hack/generate.sh --verify   changes nothing; fails naming each stale file
set -euo pipefail
cd "$(dirname "$0")/.."

T=$(./hack/tools.sh)
CG=$T/controller-gen
IGWC_DIR=config/crd/bases
POOL_DIR=config/crd/inferencepool
POOL_CRD=inference.networking.k8s.io_inferencepools.yaml
CHART=deploy/helm/kvgate
# Files under deploy/ the chart ships a copy of, in files/.
COPIES=(grafana/kvgate.json prometheus/kvgate-rules.yaml)

# crds IGWC_OUT POOL_OUT: both CRDs, each into its own folder.
crds() {
  "$CG" crd paths=./api/v1alpha1/... output:crd:dir="$1"
  "$CG" crd paths=./api/inferencepool/... output:crd:dir="$2"
}

if [ "${1:-}" != --verify ]; then
  "$CG" object paths=./api/...
  crds "$IGWC_DIR" "$POOL_DIR"
  cp "$IGWC_DIR"/*.yaml "$CHART/crds/"
  mkdir -p "$CHART/files"
  cp "$POOL_DIR/$POOL_CRD" "$CHART/files/"
  for f in "${COPIES[@]}"; do mkdir -p "$CHART/files/$(dirname "$f")" && cp "deploy/$f" "$CHART/files/$f"; done
  exit 0
fi

stale=0
say() { echo "verify-generate: $*" >&2; stale=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

crds "$tmp/igwc" "$tmp/pool"
diff -r "$tmp/igwc" "$IGWC_DIR" >&2 || say "$IGWC_DIR is stale"
diff -r "$IGWC_DIR" "$CHART/crds" >&2 || say "$CHART/crds differs from $IGWC_DIR"
[ "$(ls "$tmp/pool")" = "$POOL_CRD" ] || say "controller-gen wrote $(ls "$tmp/pool" | xargs) for api/inferencepool, not $POOL_CRD alone"
diff "$tmp/pool/$POOL_CRD" "$POOL_DIR/$POOL_CRD" >&2 || say "$POOL_DIR/$POOL_CRD is stale"
cmp "$POOL_DIR/$POOL_CRD" "$CHART/files/$POOL_CRD" >&2 || say "$CHART/files/$POOL_CRD differs from $POOL_DIR/$POOL_CRD"
for f in "${COPIES[@]}"; do
  cmp "deploy/$f" "$CHART/files/$f" >&2 || say "$CHART/files/$f differs from deploy/$f"
done

# controller-gen writes deep-copy code only in place: keep the committed files,
# regenerate, compare, and put the committed ones back.
mapfile -t before < <(find api -name zz_generated.deepcopy.go | sort)
for f in "${before[@]}"; do mkdir -p "$tmp/keep/$(dirname "$f")" && cp "$f" "$tmp/keep/$f"; done
"$CG" object paths=./api/...
while read -r f; do
  if [ ! -e "$tmp/keep/$f" ]; then
    say "$f is missing"
    rm -f "$f"
  elif ! cmp -s "$f" "$tmp/keep/$f"; then
    say "$f is stale"
  fi
done < <(find api -name zz_generated.deepcopy.go | sort)
for f in "${before[@]}"; do cp "$tmp/keep/$f" "$f"; done

if [ $stale != 0 ]; then
  echo "generated code or manifests are stale: run make generate" >&2
  exit 1
fi
