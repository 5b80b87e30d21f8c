#!/bin/sh
# Generates the Go code of carve's own gRPC services (api/) from their .proto
# files into OUT (first argument; default the repository itself), with the
# toolchain the checked-in code was generated with: protoc 3.21.12 (Debian's
# protobuf-compiler, installed when missing and running as root) and the Go
# plugins at the versions go.mod pins in its tool block. hack/verify.sh
# generates into a scratch directory and compares.
set -eu
cd "$(dirname "$0")/.."
out=${1:-.}
GO=${GO:-go}
PROTOC_VERSION=3.21.12
if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "generate: protoc not found: install Debian's protobuf-compiler ($PROTOC_VERSION) as root" >&2
    exit 1
  fi
  apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
fi
have=$(protoc --version)
if [ "$have" != "libprotoc $PROTOC_VERSION" ]; then
  echo "generate: need protoc $PROTOC_VERSION, the version api/ was generated with; found $have" >&2
  exit 1
fi
gen_go=$($GO tool -n protoc-gen-go)
gen_grpc=$($GO tool -n protoc-gen-go-grpc)
mkdir -p "$out"
protoc \
  --plugin=protoc-gen-go="$gen_go" --plugin=protoc-gen-go-grpc="$gen_grpc" \
  --go_out="$out" --go_opt=module=github.com/carve-csi/carve \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/carve-csi/carve \
  $(find api -name '*.proto' | sort)
