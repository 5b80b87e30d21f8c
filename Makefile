# carve: see README.md for what each target does, docs/development.md for the tiers.
GO ?= go
BIN := bin
CACHE ?= $(HOME)/.cache/carve
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/carve-csi/carve/pkg/version.Version=$(VERSION)
export CARVE_CACHE := $(CACHE)

.PHONY: all build lint test test-unit test-host test-guest test-deploy deploy-tools bench deps clean cachedir

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

# Everything that needs device-mapper, inside a qemu guest (test/guestvm;
# docs/development.md). The initramfs is cached under $(CACHE)/guest.
# Benchmarks (TestBench*) only run in `make bench`.
test-guest: deps cachedir
	$(GO) test -tags guesttest -count=1 -timeout 30m -skip '^TestBench' -v ./test/guest/... 2>&1 | tee $(CACHE)/test-guest.log | ./hack/summarize-go-test.sh guest

# What users install: the kustomize base, the Helm chart, the Dockerfile,
# the dashboard and the alert rules (test/deploy; root, for the plugin on a
# loop-device volume group). helm and kustomize come from the Go module proxy.
HELM_VERSION := v3.22.0
KUSTOMIZE_VERSION := v5.8.2

deploy-tools: cachedir
	@test -f $(CACHE)/bin/.helm-$(HELM_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && touch $(CACHE)/bin/.helm-$(HELM_VERSION); }
	@test -f $(CACHE)/bin/.kustomize-$(KUSTOMIZE_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION) && touch $(CACHE)/bin/.kustomize-$(KUSTOMIZE_VERSION); }

test-deploy: deps deploy-tools
	$(GO) test -tags hosttest -count=1 -timeout 10m -v ./test/deploy/... 2>&1 | tee $(CACHE)/test-deploy.log | ./hack/summarize-go-test.sh deploy

test: lint test-unit test-host test-guest test-deploy

# Package against raw lvm commands in the guest, printed as ratios.
bench: deps cachedir
	$(GO) test -tags guesttest -count=1 -timeout 40m -run '^TestBench' -v ./test/guest/... 2>&1 | tee $(CACHE)/bench.log | ./hack/summarize-go-test.sh bench
	@grep '^ratio' $(CACHE)/bench.log

clean:
	rm -rf $(BIN)

cachedir:
	@mkdir -p $(CACHE)
