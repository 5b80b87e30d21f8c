#!/usr/bin/env bash
# Builds the end-to-end tier's control plane (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager), the kubelet of the guest nodes,
# kubectl (to look at the demo's cluster), csi-provisioner, csi-resizer,
# csi-snapshotter and snapshot-controller from the Go module proxy, pinned
# by the tools modules under test/tools/, and prints the directory
# that holds them all, $CARVE_CACHE/e2e/<hash>/bin, on stdout.
#
# Each tools module's binaries are cached on their own, in
# $CARVE_CACHE/e2e/mod/<module>-<key>, <key> covering that module's
# go.mod (but its module line, which only says where the pin sits),
# go.sum and the Go version: a changed pin rebuilds only that module's
# binaries. <hash> covers the modules' keys; its bin directory
# holds hard links to their binaries.
#
# CARVE_K8S=<minor> (e.g. 1.30, make test-e2e-oldest) takes the control
# plane (kube-apiserver, kube-scheduler, kube-controller-manager) from the
# tools module test/tools/kubernetes-<minor> instead, in its own cache
# key; the kubelet and kubectl stay at the main pin (the end-to-end tier
# runs no kubelet; do not run the nodes tier with such a directory).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/test/tools
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
goversion=$("$go" version)
cpmod=kubernetes
if [ -n "${CARVE_K8S:-}" ]; then
	cpmod=kubernetes-$CARVE_K8S
	[ -f "$tools/$cpmod/go.mod" ] || {
		echo "e2e tools: CARVE_K8S=$CARVE_K8S: no tools module $tools/$cpmod" >&2
		exit 1
	}
fi

# What each tools module builds: "<module dir> <binary> <package>".
targets=(
	"etcd etcd go.etcd.io/etcd/server/v3"
	"$cpmod kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
	"$cpmod kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
	"$cpmod kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
	"kubernetes kubelet k8s.io/kubernetes/cmd/kubelet"
	"kubernetes kubectl k8s.io/kubernetes/cmd/kubectl"
	"provisioner csi-provisioner github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	"resizer csi-resizer github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	"snapshotter csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	"snapshotter snapshot-controller github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)

modkey() { # modkey <module dir>
	{ grep -v '^module ' "$tools/$1/go.mod"; cat "$tools/$1/go.sum"; echo "$goversion"; } | sha256sum | cut -c1-16
}
declare -A moddir
for t in "${targets[@]}"; do
	read -r mod _ _ <<<"$t"
	[ -n "${moddir[$mod]:-}" ] || moddir[$mod]=$cache/e2e/mod/$mod-$(modkey "$mod")
done
hash=$(for mod in $(printf '%s\n' "${!moddir[@]}" | sort); do echo "${moddir[$mod]}"; done | sha256sum | cut -c1-16)
out=$cache/e2e/$hash/bin

complete() {
	for t in "${targets[@]}"; do
		read -r _ bin _ <<<"$t"
		[ -x "$out/$bin" ] || return 1
	done
}

if complete; then
	echo "e2e tools: cached in $out" >&2
	echo "$out"
	exit 0
fi

# The control plane reports its release through component-base's version
# variables, as an official build does.
kflags() { # kflags <module dir>
	local kver
	kver=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$tools/$1/go.mod" | head -n1)
	echo "-X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$kver" | cut -d. -f2)"
}

start=$(date +%s)
mkdir -p "$cache/e2e/mod"
for t in "${targets[@]}"; do
	read -r mod bin pkg <<<"$t"
	dir=${moddir[$mod]}
	[ -x "$dir/$bin" ] && continue
	flags="-s -w"
	case $mod in kubernetes*) flags="$flags $(kflags "$mod")" ;; esac
	echo "e2e tools: building $bin ($pkg)" >&2
	mkdir -p "$dir"
	# Build beside and rename into place, so an interrupted build never
	# leaves a binary that looks complete.
	(cd "$tools/$mod" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "$flags" -o "$dir/.$bin.tmp" "$pkg")
	mv "$dir/.$bin.tmp" "$dir/$bin"
done

tmp=$(mktemp -d "$cache/e2e/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for t in "${targets[@]}"; do
	read -r mod bin _ <<<"$t"
	ln "${moddir[$mod]}/$bin" "$tmp/$bin" 2>/dev/null || cp "${moddir[$mod]}/$bin" "$tmp/$bin"
done
mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "e2e tools: ready in $(($(date +%s) - start)) s in $out" >&2
echo "$out"
