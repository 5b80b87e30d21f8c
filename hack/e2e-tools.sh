#!/usr/bin/env bash
# Builds the end-to-end tier's control plane (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager), the kubelet of the guest nodes,
# kubectl (to look at the demo's cluster), csi-provisioner and csi-resizer from the Go module proxy, pinned
# by the tools modules under test/e2e/tools/, into $CARVE_CACHE/e2e/<hash>/bin,
# and prints that directory on stdout. <hash> covers the tools modules'
# go.mod/go.sum and the Go version, so a warm run (same pins) reuses the
# binaries and a changed pin builds a new set.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/test/e2e/tools
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}

hash=$( { cat "$tools"/*/go.mod "$tools"/*/go.sum; "$go" version; } | sha256sum | cut -c1-16)
out=$cache/e2e/$hash/bin
bins=(etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl csi-provisioner csi-resizer)

complete() {
	for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}

if complete; then
	echo "e2e tools: cached in $out" >&2
	echo "$out"
	exit 0
fi

# Build into a fresh directory and rename it into place, so an interrupted
# build never leaves a half-filled cache entry that looks complete.
mkdir -p "$cache/e2e"
tmp=$(mktemp -d "$cache/e2e/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

build() { # build <module dir> <output name> <package> [ldflags]
	echo "e2e tools: building $2 ($3)" >&2
	(cd "$tools/$1" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w ${4:-}" -o "$tmp/$2" "$3")
}

# The control plane reports its release through component-base's version
# variables, as an official build does.
kver=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$tools/kubernetes/go.mod")
kminor=$(echo "$kver" | cut -d. -f2)
kflags="-X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kminor"

build etcd etcd go.etcd.io/etcd/server/v3
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kflags"
build kubernetes kubelet k8s.io/kubernetes/cmd/kubelet "$kflags"
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl "$kflags"
build provisioner csi-provisioner github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
build resizer csi-resizer github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer

mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "e2e tools: built in $(( $(date +%s) - start )) s into $out" >&2
echo "$out"
