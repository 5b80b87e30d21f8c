#!/bin/sh
# Regenerates the Go code of carve's own gRPC service (api/nodeagent/v1)
# from its .proto: protoc from Debian, the Go plugins from the module proxy
# at the versions pinned here, into $CARVE_CACHE/bin.
set -eu
cd "$(dirname "$0")/.."
CACHE=${CARVE_CACHE:-$HOME/.cache/carve}
GO=${GO:-go}
PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.2
command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
mkdir -p "$CACHE/bin"
test -x "$CACHE/bin/protoc-gen-go" || GOBIN="$CACHE/bin" $GO install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
test -x "$CACHE/bin/protoc-gen-go-grpc" || GOBIN="$CACHE/bin" $GO install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"
PATH="$CACHE/bin:$PATH" protoc \
  --go_out=. --go_opt=module=github.com/carve-csi/carve \
  --go-grpc_out=. --go-grpc_opt=module=github.com/carve-csi/carve \
  api/nodeagent/v1/nodeagent.proto
