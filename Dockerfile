# carve's container image: one static binary (every role is a subcommand) on
# a Debian runtime that carries the programs the plugin runs: lvm2 (and
# thin_check, which lvm runs when it activates a thin pool), mkfs/fsck/grow
# tools for ext4, xfs and btrfs, and util-linux/mount (mount, umount, blkid,
# blockdev, findmnt). test/deploy checks that every program carve runs comes
# from a package installed here.
ARG GO_VERSION=1.26.8
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
# The builder's Go module proxy and flags (make image passes its own); when
# not given, go's defaults apply.
ARG GOPROXY
ARG GOFLAGS
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/carve-csi/carve/pkg/version.Version=${VERSION}" \
      -o /out/carve ./cmd/carve

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      lvm2 \
      thin-provisioning-tools \
      e2fsprogs \
      xfsprogs \
      btrfs-progs \
      util-linux \
      mount \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/carve /usr/local/bin/carve
ENTRYPOINT ["/usr/local/bin/carve"]
