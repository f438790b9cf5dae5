#!/usr/bin/env bash
# make unit: gets the real parts the tests run against — kube-apiserver and
# etcd, helm, redis-server, chromium — then runs the tests with the race detector.
# A part that cannot be built or installed fails the run with the reason;
# KVGATE_SKIP=kube,helm,redis,chromium (or all) runs without the parts it names, and
# the run then says at its end what it did not test.
#
#   hack/unit.sh [PACKAGES...]     (default ./...)
set -euo pipefail
cd "$(dirname "$0")/.."

skip=${KVGATE_SKIP:-}
IFS=, read -r -a skipped <<<"${skip// /}"
for s in "${skipped[@]}"; do
  case $s in kube | helm | redis | chromium | all) ;; *)
    echo "unit: KVGATE_SKIP names '$s'; it takes kube, helm, redis, chromium or all" >&2
    exit 2 ;;
  esac
done
wants() { [[ ",${skip// /}," != *",$1,"* && ",${skip// /}," != *",all,"* ]]; }

fail() {
  echo "unit: $1 could not be built or installed (see above), so the tests that need it cannot run." >&2
  echo "unit: fix that, or run without them: KVGATE_SKIP=$2 make test" >&2
  exit 1
}

if wants kube; then
  KUBEBUILDER_ASSETS=$(./hack/envtest-bins.sh) || fail "kube-apiserver/etcd" kube
  export KUBEBUILDER_ASSETS
fi
if wants helm; then
  tools=$(./hack/tools.sh) || fail "helm" helm
  export KVGATE_HELM=$tools/helm
fi
if wants redis; then
  KVGATE_REDIS_SERVER=$(./hack/redis.sh) || fail "redis-server" redis
  export KVGATE_REDIS_SERVER
fi
if wants chromium; then
  KVGATE_CHROMIUM=$(./hack/chromium.sh) || fail "chromium" chromium
  export KVGATE_CHROMIUM
fi

[ $# -gt 0 ] || set -- ./...
echo "unit: go test -race $* (about 3 min on 2 cores once compiled; compiling the tests the first time adds 6-10 min)" >&2
./hack/progress.sh "go test -race" "about 3 min on 2 cores once compiled; compiling the tests the first time adds 6-10 min" \
  go test -race -count=1 -timeout 25m "$@"
