#!/usr/bin/env bash
# Builds, or finds in the cache, the five image archives a node of the
# guest test bed imports with `ctr -n k8s.io images import` (no registry is
# reachable there), and prints the directory that holds them:
#
#   carve.tar            carve's image, from the Dockerfile (hack/image.sh)
#   csi-provisioner.tar  /csi-provisioner as entrypoint, one layer
#   csi-resizer.tar      /csi-resizer as entrypoint, one layer
#   csi-snapshotter.tar  /csi-snapshotter as entrypoint, one layer
#   pause.tar            /pause (test/cmd/pause), containerd's sandbox
#   images.txt           "NAME FILE" per line
#   Dockerfile.sha256    the Dockerfile carve.tar was built from
#
# Each archive is named exactly as deploy/kubernetes names the image (read
# from the manifests here); the pause image is registry.k8s.io/pause:3.10,
# the test bed's CRI sandbox_image. The sidecars are the binaries
# hack/e2e-tools.sh builds. `make images` runs it (root, for hack/image.sh).
#
# The directory is $CARVE_CACHE/images/set/<key>; <key> covers carve's
# archive (its own key), the sidecar binaries, the names and the sources of
# pause and of the archive writer, so a warm run only computes the key.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
images=$cache/images
pause_name=registry.k8s.io/pause:3.10

say() { echo "images: $*" >&2; }
die() { echo "images: $*" >&2; exit 1; }

# image_of NAME: the one image deploy/kubernetes runs whose repository ends
# in /NAME.
image_of() {
	local found
	found=$(grep -hoE "image: *[^ ]+/$1:[^ ]+" "$root"/deploy/kubernetes/*.yaml | awk '{print $2}' | sort -u)
	[ "$(echo "$found" | wc -w)" = 1 ] || die "deploy/kubernetes names the $1 image '${found//$'\n'/ }', want exactly one name"
	echo "$found"
}
provisioner=$(image_of csi-provisioner)
resizer=$(image_of csi-resizer)
snapshotter=$(image_of csi-snapshotter)

carve_tar=$("$root/hack/image.sh")
bindir=$("$root/hack/e2e-tools.sh")

# shellcheck source=hack/lib/images.sh
. "$root/hack/lib/images.sh"
mapfile -t srcs < <(go_sources ./test/cmd/pause ./test/harness/ociimage/cmd/ociarchive)
sidecars=$(sha256sum "$bindir/csi-provisioner" "$bindir/csi-resizer" "$bindir/csi-snapshotter" | cut -d' ' -f1)
key=$(cache_key go.mod go.sum hack/images.sh hack/lib/images.sh "${srcs[@]}" \
	-- "$sidecars" "$carve_tar" "$provisioner" "$resizer" "$snapshotter" "$pause_name" "$("$go" env GOVERSION)")
out=$images/set/$key

if [ -f "$out/images.txt" ]; then
	say "cached: $out"
	echo "$out"
	exit 0
fi

mkdir -p "$images/set"
tmp=$(mktemp -d "$images/set/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A hard link costs no space; the carve build keeps its own copy.
ln "$carve_tar" "$tmp/carve.tar" 2>/dev/null || cp "$carve_tar" "$tmp/carve.tar"
cp "$(dirname "$carve_tar")/Dockerfile.sha256" "$tmp/"
(cd "$root" &&
	CGO_ENABLED=0 "$go" build -trimpath -ldflags '-s -w' -o "$tmp/bin/pause" ./test/cmd/pause &&
	"$go" build -o "$tmp/bin/ociarchive" ./test/harness/ociimage/cmd/ociarchive)
pack() { # pack FILE NAME BINARY: BINARY as /<its name>, the entrypoint
	"$tmp/bin/ociarchive" files -name "$2" -o "$tmp/$1" "$3:/$(basename "$3")"
}
pack csi-provisioner.tar "$provisioner" "$bindir/csi-provisioner"
pack csi-resizer.tar "$resizer" "$bindir/csi-resizer"
pack csi-snapshotter.tar "$snapshotter" "$bindir/csi-snapshotter"
pack pause.tar "$pause_name" "$tmp/bin/pause"
rm -rf "$tmp/bin"
printf '%s %s\n' "$(image_of carve)" carve.tar "$provisioner" csi-provisioner.tar "$resizer" csi-resizer.tar \
	"$snapshotter" csi-snapshotter.tar "$pause_name" pause.tar >"$tmp/images.txt"
chmod 755 "$tmp"
# A run beside this one may have finished first: keep its directory, which
# someone may be reading, rather than replace it.
if mv -T "$tmp" "$out" 2>/dev/null; then
	trap - EXIT
fi
[ -f "$out/images.txt" ] || die "could not move the archives into $out"

keep_newest "$images/set" 3
say "ready in $out ($(du -shL "$out" | cut -f1), $(cd "$out" && du -m ./*.tar | awk '{printf "%s %s MB; ", $2, $1}'))"
echo "$out"
