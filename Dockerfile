# carve's container image: two static binaries of cmd/carve, carve (every
# role is a subcommand; the controller Deployment runs it) and carve-node
# (built with -tags nodeagent,grpcnotrace: the node agent's node role without any
# Kubernetes client, half the resident memory; the node DaemonSets run it),
# on a Debian runtime that carries the programs the plugin runs: lvm2 (and
# thin_check, which lvm runs when it activates a thin pool; thin_delta and
# dmsetup, which a move's catch-up runs), mkfs/fsck/grow
# tools for ext4, xfs and btrfs, and util-linux/mount (mount, umount, blkid,
# blockdev, findmnt). test/deploy checks that every program carve runs comes
# from a package installed here.
#
# tini is the node agent's PID 1 (the DaemonSet's command): lvm's daemons
# (dmeventd, forked by an lvm that wants a snapshot or pool monitored)
# detach, and their processes are re-parented to PID 1, which must reap
# them. carve does not: a reaper beside os/exec would take the exit
# statuses exec waits for. tini forwards SIGTERM to carve alone (not to
# its process group), so an lvm mutation in flight is not interrupted and
# carve's shutdown waits for it as before.
#
# Multi-arch: the build stage runs on the builder's platform and
# cross-compiles for the target's (docker buildx build --platform
# linux/amd64,linux/arm64 sets BUILDPLATFORM, TARGETOS and TARGETARCH); the
# runtime stage is the target's Debian. A plain build makes the builder's
# own architecture.
ARG GO_VERSION=1.26.8
ARG DEBIAN_RELEASE=bookworm

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
# The builder's Go module proxy and flags (make image passes its own); when
# not given, go's defaults apply.
ARG GOPROXY
ARG GOFLAGS
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 go build -trimpath -tags grpcnotrace \
      -ldflags "-s -w -X github.com/carve-csi/carve/internal/version.Version=${VERSION}" \
      -o /out/carve ./cmd/carve \
 && GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 go build -trimpath -tags nodeagent,grpcnotrace \
      -ldflags "-s -w -X github.com/carve-csi/carve/internal/version.Version=${VERSION}" \
      -o /out/carve-node ./cmd/carve

FROM debian:${DEBIAN_RELEASE}-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="carve" \
      org.opencontainers.image.description="CSI driver for local persistent volumes carved out of LVM volume groups" \
      org.opencontainers.image.source="https://github.com/carve-csi/carve" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      lvm2 \
      dmsetup \
      cryptsetup-bin \
      thin-provisioning-tools \
      e2fsprogs \
      xfsprogs \
      btrfs-progs \
      util-linux \
      mount \
      tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/carve /usr/local/bin/carve
COPY --from=build /out/carve-node /usr/local/bin/carve-node
ENTRYPOINT ["/usr/local/bin/carve"]
