#!/usr/bin/env bash
# Copies the VolumeSnapshot, VolumeSnapshotContent and VolumeSnapshotClass
# CRDs of the external-snapshotter release pinned in
# test/tools/snapshotter (the one whose csi-snapshotter and
# snapshot-controller the tests build) from its Go module download into
# the chart's deploy/helm/carve/files/snapshot-crds (make manifests copies them on into
# deploy/kubernetes/snapshot-controller), each under a comment naming its
# source. Run it after changing that pin;
# test/deploy (TestSnapshotCRDsFromPinnedModule) fails until the copies
# match the pinned module. CRD_DIR writes them elsewhere (hack/verify.sh).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
go=${GO:-go}
crds=${CRD_DIR:-$root/deploy/helm/carve/files/snapshot-crds}
mod=github.com/kubernetes-csi/external-snapshotter/client/v8

read -r dir version < <(cd "$root/test/tools/snapshotter" &&
	"$go" mod download "$mod" && "$go" list -m -f '{{.Dir}} {{.Version}}' "$mod")
for f in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
	name=snapshot.storage.k8s.io_$f.yaml
	{
		echo "# From the Go module $mod@$version, file config/crd/$name"
		echo "# (copied by hack/snapshot-crds.sh; do not edit)."
		cat "$dir/config/crd/$name"
	} >"$crds/$name"
done
echo "snapshot CRDs of $mod@$version copied" >&2
