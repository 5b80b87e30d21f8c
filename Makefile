# carve: see README.md for what each target does, docs/development.md for the tiers.
GO ?= go
BIN := bin
CACHE ?= $(HOME)/.cache/carve
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/carve-csi/carve/pkg/version.Version=$(VERSION)
export CARVE_CACHE := $(CACHE)

.PHONY: all build lint test test-unit test-host test-guest bench deps clean cachedir

all: build

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/carve ./cmd/carve

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags hosttest,guesttest,guestinner,e2e ./...

# Pure logic; no root.
test-unit:
	$(GO) test -race -count=1 ./...

deps:
	./hack/install-deps.sh

# The lvm package against real lvm2 on loop devices, activation disabled.
test-host: deps cachedir
	$(GO) test -tags hosttest -count=1 -v ./test/host/... 2>&1 | tee $(CACHE)/test-host.log | ./hack/summarize-go-test.sh host

# Everything that needs device-mapper, inside a qemu guest.
test-guest: deps cachedir
	$(GO) test -tags guesttest -count=1 -timeout 30m -v ./test/guest/... 2>&1 | tee $(CACHE)/test-guest.log | ./hack/summarize-go-test.sh guest

test: lint test-unit test-host test-guest

bench: deps cachedir
	$(GO) test -tags guesttest -count=1 -timeout 30m -run '^TestBench' -v ./test/guest/... 2>&1 | tee $(CACHE)/bench.log

clean:
	rm -rf $(BIN)

cachedir:
	@mkdir -p $(CACHE)
