# carve: see README.md for what each target does, docs/development.md for the tiers.
GO ?= go
BIN := bin
CACHE ?= $(HOME)/.cache/carve
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/carve-csi/carve/internal/version.Version=$(VERSION)
# carve-node's build tags (cmd/carve/nodeagent_test.go checks what they
# leave out).
NODE_TAGS := nodeagent,grpcnotrace
export CARVE_CACHE := $(CACHE)

.PHONY: all build generate image images manifests verify helm krew release-artifacts release-push-chart lint test test-unit fuzz test-host test-guest test-deploy deploy-tools test-e2e test-e2e-oldest measure-restore-placement measure-placement-nodes measure-move test-host-side test-nodes test-nodes-peer test-databases bench-database demo bench bench-peers soak deps clean cachedir

all: build

# The Go code of api/ from its .proto files (committed; run after editing a
# .proto), with protoc 3.21.12 and the Go plugins of go.mod's tool block.
generate:
	@GO='$(GO)' ./hack/generate.sh

# carve-node is the node agent's binary: cmd/carve with -tags nodeagent,
# the node role without the controller and so without client-go (about
# half the resident memory of carve node; docs/benchmarks.md).
# grpcnotrace leaves out gRPC's request tracing (golang.org/x/net/trace and
# html/template, never served): 3.3 MiB less resident code per process.
build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -tags grpcnotrace -o $(BIN)/carve ./cmd/carve
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -tags $(NODE_TAGS) -o $(BIN)/carve-node ./cmd/carve
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kubectl-carve ./cmd/kubectl-carve
	install -m 0755 cmd/kubectl-carve/kubectl_complete-carve $(BIN)/kubectl_complete-carve

# carve's image from the Dockerfile with Debian's buildah: no daemon, no
# registry (base images made with mmdebstrap; docs/development.md#images).
# Root. Prints the OCI archive, cached under $(CACHE)/images by its inputs.
image: deps cachedir
	@VERSION='$(VERSION)' GO='$(GO)' ./hack/image.sh

# The archives a guest node imports: carve's image, csi-provisioner,
# csi-resizer (from hack/e2e-tools.sh) and registry.k8s.io/pause:3.10, named
# as the manifests name them. Prints their directory.
images: deps cachedir
	@VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh

# golangci-lint (settings in .golangci.yml) comes from the Go module proxy
# into $(CACHE)/bin, once per version.
GOLANGCI_LINT_VERSION := v2.15.0
# actionlint checks the GitHub Actions workflows (.github/workflows).
ACTIONLINT_VERSION := v1.7.12

lint: cachedir
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags hosttest,guesttest,guestinner,e2e,nodes,databases,peers,deploytest ./...
	$(GO) vet -tags $(NODE_TAGS) ./cmd/carve
	@test -f $(CACHE)/bin/.golangci-lint-$(GOLANGCI_LINT_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && touch $(CACHE)/bin/.golangci-lint-$(GOLANGCI_LINT_VERSION); }
	$(CACHE)/bin/golangci-lint run --build-tags hosttest,guesttest,guestinner,e2e,nodes,databases,peers,deploytest ./...
	$(CACHE)/bin/golangci-lint run --build-tags $(NODE_TAGS) ./cmd/carve
	@test -f $(CACHE)/bin/.actionlint-$(ACTIONLINT_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION) && touch $(CACHE)/bin/.actionlint-$(ACTIONLINT_VERSION); }
	$(CACHE)/bin/actionlint .github/workflows/*.yaml

# Pure logic; no root. cmd/carve also as carve-node (-tags $(NODE_TAGS)).
test-unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -race -count=1 -tags $(NODE_TAGS) ./cmd/carve

# Each fuzz target for FUZZTIME, one after the other (go test -fuzz takes
# one target per run). Their seed corpora already run in test-unit.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./internal/node/lvm:FuzzParseReport ./internal/node/deviceclass:FuzzParse \
  ./internal/volume:FuzzVolumeName ./internal/volume:FuzzParseVolumeID

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $${t#*:} in $${t%%:*} for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*}; \
	done

deps:
	./hack/install-deps.sh

# The lvm package against real lvm2 on loop devices, activation disabled.
test-host: deps cachedir
	$(GO) test -tags hosttest -count=1 -v ./test/host/... 2>&1 | tee $(CACHE)/test-host.log | ./hack/summarize-go-test.sh host

# Everything that needs device-mapper, inside a qemu guest (test/harness/guestvm;
# docs/development.md). The initramfs is cached under $(CACHE)/guest.
# Benchmarks (TestBench*) only run in `make bench`. The timeout guards
# against a hang only: on a loaded 2-core machine TestPluginNode alone
# took 19 min (10 when quiet).
test-guest: deps cachedir
	$(GO) test -tags guesttest -count=1 -p 1 -timeout 45m -skip '^TestBench' -v ./test/guest/... 2>&1 | tee $(CACHE)/test-guest.log | ./hack/summarize-go-test.sh guest

# What users install: the kustomize base, the Helm chart, the Dockerfile and
# the image it builds (make images; CARVE_IMAGES is their directory), the
# dashboard and the alert rules (test/deploy, tag deploytest; root, for the
# plugin on a loop-device volume group). helm, kustomize and promtool come
# from the Go module proxy.
HELM_VERSION := v3.22.0
KUSTOMIZE_VERSION := v5.8.2
# promtool checks and unit-tests the alert rules (test/deploy); the
# Prometheus server of the same release scrapes the e2e test bed and
# answers every dashboard and alert query (test/e2e, TestPrometheus). Both
# built without the service discoveries (Prometheus' remove_all_sd tag;
# the file and http ones stay), which neither uses, and the server without
# its web UI's assets (they sit behind the builtinassets tag): the test
# uses its HTTP API only.
PROMTOOL_VERSION := v0.316.0
PROMTOOL_TAGS := remove_all_sd

helm: cachedir
	@test -f $(CACHE)/bin/.helm-$(HELM_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && touch $(CACHE)/bin/.helm-$(HELM_VERSION); }

deploy-tools: helm cachedir
	@test -f $(CACHE)/bin/.kustomize-$(KUSTOMIZE_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION) && touch $(CACHE)/bin/.kustomize-$(KUSTOMIZE_VERSION); }
	@test -f $(CACHE)/bin/.promtool-$(PROMTOOL_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install -tags $(PROMTOOL_TAGS) github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION) && touch $(CACHE)/bin/.promtool-$(PROMTOOL_VERSION); }
	@test -f $(CACHE)/bin/.prometheus-$(PROMTOOL_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install -tags $(PROMTOOL_TAGS) github.com/prometheus/prometheus/cmd/prometheus@$(PROMTOOL_VERSION) && touch $(CACHE)/bin/.prometheus-$(PROMTOOL_VERSION); }

# The kustomize base in deploy/kubernetes is rendered from the Helm chart
# (hack/manifests; namespace.yaml is the one hand-written file): edit the
# chart, then run this. test/deploy fails when the two disagree.
manifests: helm
	$(GO) run ./hack/manifests --helm $(CACHE)/bin/helm --chart deploy/helm/carve --out deploy/kubernetes \
	  --component deploy/kubernetes/components/monitoring --rules deploy/prometheus/carve-rules.yaml

# Regenerates, in scratch copies, the protobuf code of api/ (make generate)
# and everything generated in deploy/ (the snapshot CRDs of
# hack/snapshot-crds.sh, the chart's copy of the dashboard, what make
# manifests renders), checks go.mod and go.sum with go mod tidy -diff, and
# fails when any differs from the working tree, which it leaves alone
# (hack/verify.sh); and checks every relative link of the README and docs/
# (a file that exists, an anchor that is a heading there: test/deploy's
# TestDocLinks) and that no table cell there is over 1,000 characters
# (TestDocTableCells).
verify: helm
	@GO='$(GO)' HELM=$(CACHE)/bin/helm ./hack/verify.sh
	@$(GO) test -tags deploytest -count=1 -run '^TestDoc(Links|TableCells)$$' ./test/deploy/

# Release artifacts of VERSION (a tag vX.Y.Z) in $(DIST): the chart archive
# and its repository index, the manifests with that image tag, the
# CHANGELOG.md section, the kubectl-carve archives of PLATFORMS (default:
# linux and darwin, amd64 and arm64) with krew's manifest of them, and
# SHA256SUMS (hack/release.sh). The release workflow
# (.github/workflows/release.yaml) runs these targets on a tag.
DIST ?= dist
CHART_REGISTRY ?= oci://ghcr.io/carve-csi/charts
PLATFORMS ?=
# krew installs the release's plugin manifest from its archive in
# test/deploy (krew install --manifest --archive, as krew-index asks).
KREW_VERSION := v0.4.4

krew: cachedir
	@test -f $(CACHE)/bin/.krew-$(KREW_VERSION) || { GOBIN=$(CACHE)/bin $(GO) install sigs.k8s.io/krew/cmd/krew@$(KREW_VERSION) && touch $(CACHE)/bin/.krew-$(KREW_VERSION); }

release-artifacts: deploy-tools
	@VERSION='$(VERSION)' DIST='$(DIST)' GO='$(GO)' PLATFORMS='$(PLATFORMS)' ./hack/release.sh artifacts

# The chart archive of release-artifacts as an OCI chart (helm push; log
# in with helm registry login first).
release-push-chart: deploy-tools
	@VERSION='$(VERSION)' DIST='$(DIST)' CHART_REGISTRY='$(CHART_REGISTRY)' ./hack/release.sh push-chart

test-deploy: deps deploy-tools krew
	@imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  CARVE_IMAGES=$$imgdir $(GO) test -tags deploytest -count=1 -timeout 20m -v ./test/deploy/... 2>&1 | tee $(CACHE)/test-deploy.log | ./hack/summarize-go-test.sh deploy

# End to end on a real control plane (test/e2e; docs/development.md): etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager and csi-provisioner
# built from the Go module proxy by hack/e2e-tools.sh (cached under
# $(CACHE)/e2e/<hash of the pins>), three simulated nodes on loop-device
# volume groups with LVM activation disabled. No kubelet runs.
test-e2e: deps build deploy-tools cachedir
	@bindir=$$(./hack/e2e-tools.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve $(GO) test -tags e2e -count=1 -timeout 20m -skip '^TestMeasure' -v ./test/e2e/ 2>&1 | tee $(CACHE)/test-e2e.log | ./hack/summarize-go-test.sh e2e

# The end-to-end tier on the oldest Kubernetes minor the chart claims
# (Chart.yaml kubeVersion; docs/install.md#supported-kubernetes), not part
# of make test: the control plane from test/tools/kubernetes-$(E2E_OLDEST_K8S)
# (its own cache key; a cold build takes about 25 min on 2 cores).
# test/tools/kubernetes-1.29 stays to show why 1.29 is not claimed
# (CARVE_K8S=1.29: enrollment fails).
E2E_OLDEST_K8S := 1.30

test-e2e-oldest: deps build deploy-tools cachedir
	@bindir=$$(CARVE_K8S=$(E2E_OLDEST_K8S) ./hack/e2e-tools.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve $(GO) test -tags e2e -count=1 -timeout 20m -skip '^TestMeasure' -v ./test/e2e/ 2>&1 | tee $(CACHE)/test-e2e-oldest.log | ./hack/summarize-go-test.sh e2e-$(E2E_OLDEST_K8S)

# A measurement on the e2e test bed, not part of make test: how long an
# unpinned restoring pod takes to reach its snapshot's node
# (TestMeasureUnpinnedRestore; MEASURE_ROUNDS rounds).
MEASURE_ROUNDS ?= 5

measure-restore-placement: deps build deploy-tools cachedir
	@bindir=$$(./hack/e2e-tools.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_MEASURE_ROUNDS=$(MEASURE_ROUNDS) $(GO) test -tags e2e -count=1 -timeout 60m -run '^TestMeasure' -v ./test/e2e/ 2>&1 | tee $(CACHE)/measure.log | ./hack/summarize-go-test.sh measure
	@grep '^MEASURE' $(CACHE)/measure.log

# Real nodes (test/nodes; docs/development.md): the shipped kustomize base
# on a control plane whose node is a qemu guest with a kubelet, containerd
# and device-mapper, running carve's image and the sidecars of make images.
# Its TestPrometheus runs the Prometheus server of make deploy-tools
# (which installs helm too).
# NODES_RUN narrows the real-node tier to the tests it matches (go test
# -run), e.g. NODES_RUN=^TestIOLimitsChangeLive$$; the default runs all.
NODES_RUN ?= .
test-nodes: deps build deploy-tools cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_CACHE=$(CACHE) $(GO) test -tags nodes -count=1 -timeout 40m -run '$(NODES_RUN)' -skip '^(TestMeasure|TestCrossNode)' -v ./test/nodes/ 2>&1 | tee $(CACHE)/test-nodes.log | ./hack/summarize-go-test.sh nodes

# Copies across nodes on real nodes, not part of make test: the real-node
# bed plus a peer node (a second node agent with its own volume group in
# the guest, CARVE_NODES_PEER=1), and only the tests that need it
# (TestCrossNode*).
# NODES_PEER_RUN narrows the peer tier to the tests it matches (go test
# -run), e.g. NODES_PEER_RUN=^TestCrossNodeMoveParks.
NODES_PEER_RUN ?= ^TestCrossNode
test-nodes-peer: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_NODES_PEER=1 \
	  $(GO) test -tags nodes -count=1 -timeout 40m -run '$(NODES_PEER_RUN)' -v ./test/nodes/ 2>&1 | tee $(CACHE)/test-nodes-peer.log | ./hack/summarize-go-test.sh nodes-peer

# Databases on real nodes, not part of make test (docs/development.md): the
# real-node bed plus the PostgreSQL image of hack/postgres-image.sh; the
# TestDatabase* scenarios run pgbench and a client outside the guest
# through snapshots, online expansion and kills of carve, and check every
# acknowledged transaction, pgbench's invariant, pg_amcheck and
# pg_checksums. DATABASES_RUN narrows them (go test -run).
# DATABASES_PEER=1 adds the peer node of make test-nodes-peer to the bed
# and, by default, the scenarios that need it (TestCrossNodeDatabase*:
# a restore onto the peer, a move there and back, a drain of two
# databases there and back). DATABASES_CUTS picks
# TestDatabasePowerCut's cuts by number (e.g. 3,4; default all five).
DATABASES_PEER ?=
DATABASES_CUTS ?=
ifeq ($(DATABASES_PEER),1)
DATABASES_RUN ?= ^(TestDatabase|TestCrossNodeDatabase)
else
DATABASES_RUN ?= ^TestDatabase
endif
test-databases: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  pg=$$(GO='$(GO)' ./hack/postgres-image.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_POSTGRES_IMAGE=$$pg CARVE_CACHE=$(CACHE) \
	  CARVE_NODES_PEER='$(DATABASES_PEER)' CARVE_DATABASES_CUTS='$(DATABASES_CUTS)' \
	  $(GO) test -tags nodes,databases -count=1 -timeout 60m -run '$(DATABASES_RUN)' -v ./test/nodes/ 2>&1 | tee $(CACHE)/test-databases.log | ./hack/summarize-go-test.sh databases

# A measurement on the database tier's bed, not part of make test:
# pgbench's TPS on PostgreSQL on a carve thick claim, on a raw LV of the
# same volume group made by hand in the same guest, and on a carve thin
# claim (TestMeasureDatabaseTPS), BENCH_DATABASE_ROUNDS rounds (default
# 3); the MEASURE line gives the medians and the ratios.
BENCH_DATABASE_ROUNDS ?= 3
bench-database: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  pg=$$(GO='$(GO)' ./hack/postgres-image.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_POSTGRES_IMAGE=$$pg CARVE_CACHE=$(CACHE) \
	  CARVE_MEASURE_ROUNDS='$(BENCH_DATABASE_ROUNDS)' \
	  $(GO) test -tags nodes,databases -count=1 -timeout 60m -run '^TestMeasureDatabaseTPS$$' -v ./test/nodes/ 2>&1 | tee $(CACHE)/bench-database.log | ./hack/summarize-go-test.sh bench-database
	@grep 'MEASURE' $(CACHE)/bench-database.log

# A measurement on real nodes, not part of make test: a StatefulSet's
# claim moved to the peer node and back (TestCrossNodeMoveStatefulSet), a
# MOVE_SIZE claim (default 1Gi), MOVE_ROUNDS rounds (default 3); the
# MEASURE lines give each move's total time, downtime and catch-up bytes.
MOVE_SIZE ?= 1Gi
MOVE_ROUNDS ?= 3
measure-move: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_NODES_PEER=1 \
	  CARVE_MOVE_SIZE='$(MOVE_SIZE)' CARVE_MEASURE_ROUNDS='$(MOVE_ROUNDS)' \
	  $(GO) test -tags nodes -count=1 -timeout 90m -run '^TestCrossNodeMoveStatefulSet$$' -v ./test/nodes/ 2>&1 | tee $(CACHE)/measure-move.log | ./hack/summarize-go-test.sh measure-move

# A measurement on real nodes, not part of make test: the guest beside
# three bigger simulated nodes, the controller on the guest; unpinned pods
# of claims restored and cloned from a source on the guest must run there
# (TestMeasureRestoreLanding; PLACEMENT_ROUNDS rounds of each).
PLACEMENT_ROUNDS ?= 10

measure-placement-nodes: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_IMAGES=$$imgdir CARVE_NODES_SIMULATED=3 CARVE_MEASURE_ROUNDS=$(PLACEMENT_ROUNDS) \
	  $(GO) test -tags nodes -count=1 -timeout 60m -run '^TestMeasure' -v ./test/nodes/ 2>&1 | tee $(CACHE)/measure-nodes.log | ./hack/summarize-go-test.sh measure-nodes
	@grep '^MEASURE' $(CACHE)/measure-nodes.log

# The newcomer's tour (root): the e2e cluster with one real node (a qemu
# guest running the shipped DaemonSet from carve's image) and three
# simulated nodes of 2, 4 and 10 GiB, an example StorageClass and two
# StatefulSets (on the real node, PostgreSQL with data checksums under
# pgbench, from hack/postgres-image.sh's image), a table of where every
# volume landed and what the real node's containers see, each database's
# size and TPS; up until Ctrl-C, then everything is torn down.
demo: deps build cachedir
	@bindir=$$(./hack/e2e-tools.sh) && imgdir=$$(VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh) && \
	  pg=$$(GO='$(GO)' ./hack/postgres-image.sh) && \
	  $(GO) build -o $(BIN)/carve-demo ./test/cmd/demo && \
	  $(BIN)/carve-demo --bin-dir $$bindir --images $$imgdir --postgres-image $$pg --carve $(CURDIR)/$(BIN)/carve --deploy $(CURDIR)/deploy/kubernetes

# First everything the tiers build (test-prep), beside lint, then the
# unit tests. Then the guest tier (a qemu guest on both cores) runs beside
# the host-side tiers (host, deploy, e2e: mostly waiting on lvm, the
# apiserver and their processes; nothing left to build but their test
# binaries), each tier's output held until it ends; then the real-node
# tier, whose guest needs the machine to itself.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=recurse lint test-prep
	@$(MAKE) --no-print-directory verify test-unit
	@$(MAKE) --no-print-directory -j2 --output-sync=recurse test-guest test-host-side
	@$(MAKE) --no-print-directory test-nodes

# What the tiers of make test build, built (or found in the cache) before
# any tier runs, so that no compiler competes with a tier's timing: carve,
# helm, kustomize and promtool, the e2e binaries (hack/e2e-tools.sh) and
# the image archives (hack/images.sh; root).
.PHONY: test-prep
test-prep: deps build deploy-tools cachedir
	@./hack/e2e-tools.sh >/dev/null
	@VERSION='$(VERSION)' GO='$(GO)' ./hack/images.sh >/dev/null

# The host-side tiers of make test, one after the other.
test-host-side: deps build deploy-tools cachedir
	@$(MAKE) --no-print-directory test-host && $(MAKE) --no-print-directory test-deploy && $(MAKE) --no-print-directory test-e2e

# Package against raw lvm commands in the guest, printed as ratios.
# BENCH_RUN picks some of the plugin's benchmarks by pattern (e.g.
# BENCH_RUN=TestBenchNodeStage); the lvm package's then do not run.
# BENCH_ROUNDS sets the rounds of the create+delete and stage benchmarks
# (default 10 and 6), to settle ratios near their goals. BENCH_DELTA_GIB
# sets the size of TestBenchSnapshotDelta's thin volume (default 10).
BENCH_RUN ?=
BENCH_ROUNDS ?=
BENCH_DELTA_GIB ?=
bench: deps cachedir
	CARVE_BENCH_RUN='$(BENCH_RUN)' CARVE_BENCH_ROUNDS='$(BENCH_ROUNDS)' CARVE_BENCH_DELTA_GIB='$(BENCH_DELTA_GIB)' $(GO) test -tags guesttest -count=1 -p 1 -timeout 60m -run '^TestBench$(if $(BENCH_RUN),Plugin)' -v ./test/guest/... 2>&1 | tee $(CACHE)/bench.log | ./hack/summarize-go-test.sh bench
	@grep '^ratio' $(CACHE)/bench.log

# The kill soak alone, long (docs/development.md, "The kill soak"):
# SOAK_OPS calls (default 3000, about 25 min under TCG), SOAK_SEED replays
# a schedule. make test runs it at 300 calls inside test-guest.
SOAK_OPS ?= 3000
SOAK_SEED ?=
soak: deps cachedir
	CARVE_NODE_RUN='^TestSoakKillPlugin$$' CARVE_SOAK_OPS='$(SOAK_OPS)' CARVE_SOAK_SEED='$(SOAK_SEED)' $(GO) test -tags guesttest -count=1 -p 1 -timeout 100m -run '^TestPluginNode$$' -v ./test/guest/ 2>&1 | tee $(CACHE)/soak.log | ./hack/summarize-go-test.sh soak
	@grep '^SOAK seed .*operations' $(CACHE)/soak.log

# carve beside TopoLVM on the e2e control plane (test/peers, tag peers;
# docs/development.md): TopoLVM at the release pinned in
# test/tools/topolvm, built from the Go module proxy with its chart
# rendered (hack/topolvm.sh, cached under $(CACHE)/topolvm); the same
# workload against both, printed as ratios. Not part of make test.
# PEERS_CLAIMS claims per driver and pattern, PEERS_GAP the pause of the
# paced pattern, PEERS_FRESHNESS_CAP the longest wait for capacity,
# PEERS_IDLE_VOLUMES the volume counts of the idle measurement (e.g.
# 100,1000; 0 skips it), PEERS_IDLE_WINDOW how long each is measured.
PEERS_CLAIMS ?= 50
PEERS_GAP ?= 1s
PEERS_FRESHNESS_CAP ?= 90s
PEERS_IDLE_VOLUMES ?= 100
PEERS_IDLE_WINDOW ?= 2m
# PEERS_SCALE=10,30,60 runs the scale measurement instead (a test bed per
# node count; PEERS_SCALE_IDLE is each idle window).
PEERS_SCALE ?=
PEERS_SCALE_IDLE ?= 40s
# PEERS_RUN narrows the run to the tests it matches (go test -run), e.g.
# PEERS_RUN=TestPeersIdle PEERS_IDLE_VOLUMES=1000 measures memory alone.
PEERS_RUN ?=

bench-peers: deps build deploy-tools cachedir
	@bindir=$$(./hack/e2e-tools.sh) && tvdir=$$(GO='$(GO)' ./hack/topolvm.sh) && \
	  CARVE_E2E_BIN=$$bindir CARVE_BIN=$(CURDIR)/$(BIN)/carve CARVE_TOPOLVM=$$tvdir \
	  CARVE_PEERS_CLAIMS=$(PEERS_CLAIMS) CARVE_PEERS_GAP=$(PEERS_GAP) CARVE_PEERS_FRESHNESS_CAP=$(PEERS_FRESHNESS_CAP) \
	  CARVE_PEERS_IDLE_VOLUMES=$(PEERS_IDLE_VOLUMES) CARVE_PEERS_IDLE_WINDOW=$(PEERS_IDLE_WINDOW) GO='$(GO)' \
	  CARVE_PEERS_SCALE=$(PEERS_SCALE) CARVE_PEERS_SCALE_IDLE=$(PEERS_SCALE_IDLE) \
	  $(GO) test -tags peers -count=1 -timeout 60m -run '$(PEERS_RUN)' -v ./test/peers/ 2>&1 | tee $(CACHE)/bench-peers.log | ./hack/summarize-go-test.sh bench-peers
	@grep -E '^(ratio|scale model)' $(CACHE)/bench-peers.log

clean:
	rm -rf $(BIN)

cachedir:
	@mkdir -p $(CACHE)
