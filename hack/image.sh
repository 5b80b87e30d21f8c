#!/usr/bin/env bash
# Builds carve's container image from the repository's Dockerfile (the one
# `docker build .` uses) with Debian's buildah, with no daemon and no
# registry, and writes it as an OCI archive that `ctr images import` takes
# under the name the manifests give it. Prints the archive's path on stdout;
# progress goes to stderr. `make image` runs it (root).
#
#   $CARVE_CACHE/images/carve/<key>/carve.tar         the archive
#   $CARVE_CACHE/images/carve/<key>/Dockerfile.sha256 the Dockerfile it was
#                                                     built from (sha256sum)
#
# <key> covers every input: the Dockerfile and .dockerignore, go.mod/go.sum,
# the Go files cmd/carve is built from (carve, and carve-node with -tags
# nodeagent), VERSION, the image name, the base images' keys and the
# scripts. A warm run (same key) does nothing.
#
# The Dockerfile's FROM images cannot be pulled, so they are made here and
# kept in a private buildah store ($CARVE_CACHE/images/buildah), each keyed
# by its recipe: debian:<release>-slim from `mmdebstrap --variant=minbase`,
# golang:<version>-<release> from that plus this machine's Go toolchain
# (which must be the Dockerfile's GO_VERSION). The build stage gets this
# machine's Go module and build caches mounted, and its GOPROXY/GOFLAGS as
# build args.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
dockerfile=$root/Dockerfile
version=${VERSION:-$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)}
images=$cache/images

t0=$(date +%s)
say() { echo "image: [$(($(date +%s) - t0)) s] $*" >&2; }
die() { echo "image: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (buildah's chroot isolation); run make image as root"
for c in buildah mmdebstrap flock sha256sum; do
	command -v "$c" >/dev/null || die "$c is missing: run make deps (hack/install-deps.sh)"
done

# The image's name is the one the manifests run, read from them.
name=$(grep -hoE 'image: *[^ ]+/carve:[^ ]+' "$root"/deploy/kubernetes/*.yaml | awk '{print $2}' | sort -u)
[ "$(echo "$name" | wc -w)" = 1 ] || die "deploy/kubernetes names carve's image as '${name//$'\n'/ }', want exactly one name"

# The Dockerfile's global ARG defaults and its FROM images, ARGs expanded.
declare -A arg=()
while read -r k v; do arg[$k]=$v; done < <(sed -n 's/^ARG \([A-Z_]*\)=\(.*\)$/\1 \2/p' "$dockerfile")
go_version=${arg[GO_VERSION]:?the Dockerfile has no ARG GO_VERSION=}
release=${arg[DEBIAN_RELEASE]:?the Dockerfile has no ARG DEBIAN_RELEASE=}
bases=()
while read -r from; do
	for k in "${!arg[@]}"; do from=${from//\$\{$k\}/${arg[$k]}}; done
	bases+=("$from")
done < <(awk 'toupper($1) == "FROM" {for (i = 2; i <= NF; i++) if ($i !~ /^--/) {print $i; break}}' "$dockerfile")

# shellcheck source=hack/lib/images.sh
. "$root/hack/lib/images.sh"
# The recipes of the base images this script can make. Each key covers what
# the recipe depends on; debian:<release>-slim's recipe is the one
# hack/lib/debian-base.sh holds.
# shellcheck source=hack/lib/debian-base.sh
. "$root/hack/lib/debian-base.sh"
goroot=$("$go" env GOROOT)
host_go=$("$goroot/bin/go" env GOVERSION)
# As the official golang image (buildpack-deps:<release>-scm underneath,
# without the compilers: the Dockerfile builds with CGO_ENABLED=0).
golang_packages=(ca-certificates git netbase)
# The build stage fetches modules over HTTPS: it trusts what this machine
# trusts (an intercepting proxy's CA, say). Only the build stage has it;
# carve's image is not built on it.
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
host_ca_sum=none
[ -f "$host_ca" ] && host_ca_sum=$(sha256sum <"$host_ca" | cut -c1-16)
golang_image=docker.io/library/golang:$go_version-$release
golang_key=$(printf '%s\n' v2 "$debian_key" "$host_go" "$goroot" "${golang_packages[@]}" "$host_ca_sum" | sha256sum | cut -c1-16)

for b in "${bases[@]}"; do
	case $b in
	debian:$release-slim | golang:$go_version-$release) ;;
	*) die "the Dockerfile builds FROM $b, for which this script has no local recipe" ;;
	esac
done

# What cmd/carve is built from, as the build stage builds it: carve and
# carve-node (-tags nodeagent,grpcnotrace), and the archive writer.
mapfile -t srcs < <({ go_sources ./cmd/carve ./test/harness/ociimage/cmd/ociarchive &&
	go_sources -tags nodeagent,grpcnotrace ./cmd/carve; } | sort -u)
[ ${#srcs[@]} -gt 0 ] || die "go list found no source files for ./cmd/carve"
ctx_files=(Dockerfile go.mod go.sum hack/image.sh hack/lib/images.sh hack/lib/debian-base.sh)
[ -f "$root/.dockerignore" ] && ctx_files+=(.dockerignore)
key=$(cache_key "${ctx_files[@]}" "${srcs[@]}" -- "$version" "$name" "$debian_key" "$golang_key")
out=$images/carve/$key

mkdir -p "$images/carve"
# One build at a time uses the store.
exit_if_cached "$out/carve.tar" "$out/Dockerfile.sha256"
start=$(date +%s)

debian_base

if ! have "$golang_image" "$golang_key"; then
	[ "$host_go" = "go$go_version" ] || die "the Dockerfile builds with Go $go_version, this machine's Go ($goroot) is $host_go: install go$go_version"
	say "making $golang_image ($debian_image + ${golang_packages[*]} + $goroot)"
	c=$(bah from --pull-never "$debian_image")
	bah run "$c" -- apt-get update -qq
	bah run --env DEBIAN_FRONTEND=noninteractive "$c" -- apt-get install -qq -y --no-install-recommends "${golang_packages[@]}" >/dev/null
	bah run "$c" -- rm -rf /var/lib/apt/lists
	bah run "$c" -- mkdir -p /var/lib/apt/lists/partial
	if [ "$host_ca_sum" != none ]; then
		bah copy --quiet "$c" "$host_ca" /etc/ssl/certs/ca-certificates.crt >/dev/null
	fi
	bah copy --quiet "$c" "$goroot" /usr/local/go >/dev/null
	bah run "$c" -- mkdir -p -m 1777 /go /go/src /go/bin
	bah config --workingdir /go --env GOLANG_VERSION="$go_version" --env GOTOOLCHAIN=local --env GOPATH=/go \
		--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
	commit "$c" "$golang_image" "$golang_key"
fi

say "building $name from $dockerfile (VERSION=$version)"
# Debian's buildah sets no TARGETOS/TARGETARCH without --platform: give
# the host's, which is what this build makes.
buildargs=(--build-arg "VERSION=$version" --build-arg "TARGETOS=$("$go" env GOOS)" --build-arg "TARGETARCH=$("$go" env GOARCH)")
for v in GOPROXY GOFLAGS; do
	val=$("$go" env "$v")
	[ -z "$val" ] || buildargs+=(--build-arg "$v=$val")
done
# Same toolchain inside and out, so the caches are valid in both.
modcache=$("$go" env GOMODCACHE)
gocache=$("$go" env GOCACHE)
mkdir -p "$modcache" "$gocache"
bah bud --quiet --pull-never --isolation chroot --layers=false \
	--volume "$modcache:/go/pkg/mod" --volume "$gocache:/root/.cache/go-build" \
	"${buildargs[@]}" -f "$dockerfile" -t "$name" "$root" >/dev/null
say "built; writing the archive"
oci_archive "$name" carve.tar
echo "$(sha256sum <"$dockerfile" | cut -d' ' -f1)  $dockerfile" >"$tmp/out/Dockerfile.sha256"
rm -rf "$out"
mv "$tmp/out" "$out"

keep_newest "$images/carve" 3
say "built in $(($(date +%s) - start)) s: $out/carve.tar ($(du -m "$out/carve.tar" | cut -f1) MB)"
echo "$out/carve.tar"
