# kvgate — make targets. `make demo` and `make test` are the two commands a new user needs.
GO      ?= go
BIN     ?= bin/kvgate
PKGS    ?= ./...

.PHONY: all build test unit lint fmt demo bench bench-peers clean tools

all: build

build:
	$(GO) build -o $(BIN) ./cmd/kvgate

## test: everything CI checks — unit and end-to-end tests with the race detector, then lint.
test: unit lint

unit:
	$(GO) test -race -count=1 $(PKGS)

## lint: gofmt, go vet and golangci-lint (built once from the module proxy into ~/.cache/kvgate).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	"$$(./hack/tools.sh)/golangci-lint" run $(PKGS)

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

## bench: the simulator's cost benchmarks (docs/benchmarks.md quotes them).
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./...

clean:
	rm -rf bin
