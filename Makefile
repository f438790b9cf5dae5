# kvgate — make targets. `make demo` and `make test` are the two commands a new user needs.
GO      ?= go
BIN     ?= bin/kvgate
PKGS    ?= ./...

# How long the slow steps take on a 2-core machine (measured; README's quick start),
# printed while they run.
BUILD_TIME ?= first time ~2.5 min on 2 cores, with the module downloads; then seconds
VET_TIME   ?= ~30 s; ~4 min the first time, when it compiles every package without -race
LINT_TIME  ?= ~30 s; ~1 min the first time

.PHONY: all build test unit lint fmt demo bench bench-peers bench-replicas clean tools generate verify-generate

all: build

build:
	@echo "go build -o $(BIN) ./cmd/kvgate"
	@./hack/progress.sh "go build" "$(BUILD_TIME)" $(GO) build -o $(BIN) ./cmd/kvgate

## test: everything CI checks — unit and end-to-end tests with the race detector, then
## lint and a check that the generated CRD and deep-copy code match api/. Each of the
## three runs even when an earlier one failed; the run fails if any did.
## KVGATE_SKIP=kube,helm,redis,chromium (or all) runs without those real parts and says so at the end.
test:
	@rc=0; $(MAKE) --no-print-directory -k unit lint verify-generate || rc=$$?; ./hack/skipped.sh; \
	  if [ $$rc != 0 ]; then echo "make test: FAILED (see above)" >&2; \
	  elif [ -n "$$KVGATE_SKIP" ]; then echo "make test: passed, without the parts listed above"; \
	  else echo "make test: passed"; fi; exit $$rc

## generate: deep-copy code from api/; the InferenceGatewayConfig CRD into config/crd/bases
## (and the chart's crds/), the InferencePool CRD into config/crd/inferencepool (and the
## chart's files/), which nothing installs by default (hack/generate.sh).
generate:
	./hack/generate.sh

## verify-generate: fails when any generated file or copy differs from what generate writes.
verify-generate:
	@./hack/generate.sh --verify

## unit: the tests; the Kubernetes ones run against a real kube-apiserver and etcd,
## built once from the Go module proxy by hack/envtest-bins.sh (cached in
## ~/.cache/kvgate/envtest), the rate-limit ones against a real redis-server (hack/redis.sh).
## A part that cannot be had fails the run (hack/unit.sh).
unit:
	@./hack/unit.sh $(PKGS)

## lint: gofmt, go vet and golangci-lint (built once from the module proxy into ~/.cache/kvgate).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@echo "go vet $(PKGS)"
	@./hack/progress.sh "go vet" "$(VET_TIME)" $(GO) vet $(PKGS)
	@T=$$(./hack/tools.sh) && echo "golangci-lint run $(PKGS)" && \
	  ./hack/progress.sh "golangci-lint" "$(LINT_TIME)" "$$T/golangci-lint" run --allow-serial-runners $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

tools:
	./hack/tools.sh

## demo: a simulated fleet on loopback, real traffic through it, and what it did.
demo: build
	$(BIN) demo

## bench-peers: nginx (round-robin) and haproxy (leastconn) against kvgate serve, live,
## in front of one simulated fleet (installs nginx-light and haproxy when root).
bench-peers:
	./hack/bench-peers.sh

## bench-replicas: one, three sharing state (Redis) and three unshared kvgate serve replicas
## behind haproxy (mode tcp), live, each on a fresh simulated fleet of 3 H100 servers
## (installs haproxy when root; results in bench-results/replicas).
bench-replicas:
	./hack/bench-replicas.sh

## bench: the simulator's cost benchmarks (docs/benchmarks.md quotes them).
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./...

clean:
	rm -rf bin
