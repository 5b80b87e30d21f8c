#!/usr/bin/env bash
# Fails when something carve keeps generated is not what its sources
# generate, printing the diff; it never changes the working tree:
#   - the protobuf code under api/, generated again into a scratch directory
#     with the pinned protoc and Go plugins (hack/generate.sh);
#   - go.mod and go.sum against what `go mod tidy` makes of them;
#   - deploy/, generated again in a copy: the snapshot CRDs of the pinned
#     external-snapshotter module in the chart's files/snapshot-crds/
#     (hack/snapshot-crds.sh), the chart's copy of the Grafana dashboard
#     from deploy/grafana, and the kustomize base, its monitoring component
#     and the plain rule file rendered from the chart (make manifests; after
#     the CRDs, which the base's snapshot-controller kustomization copies).
# Each check runs even when an earlier one failed. `make verify` runs it.
# Needs helm ($HELM, default $CARVE_CACHE/bin/helm), protoc 3.21.12 and the
# pinned modules (the Go module proxy the first time).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
helm=${HELM:-$cache/bin/helm}
[ -x "$helm" ] || { echo "verify: helm not found at $helm (make verify installs it)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

GO="$go" "$root/hack/generate.sh" "$tmp/proto"
pbdiff() {
	cd "$1"
	diff <(find api -name '*.pb.go' | sort) <(cd "$tmp/proto" && find api -name '*.pb.go' | sort) || return 1
	local f rc=0
	for f in $(find api -name '*.pb.go' | sort); do
		diff -u "$f" "$tmp/proto/$f" || rc=1
	done
	return $rc
}
if ! (pbdiff "$root"); then
	echo "verify: the protobuf code under api/ is not what its .proto files generate (the diff above): run make generate" >&2
	failed=1
fi

if ! (cd "$root" && "$go" mod tidy -diff); then
	echo "verify: go mod tidy would change go.mod or go.sum (the diff above): run go mod tidy" >&2
	failed=1
fi

cp -a "$root/deploy" "$tmp/deploy"
gen=$tmp/deploy
CRD_DIR=$gen/helm/carve/files/snapshot-crds GO="$go" "$root/hack/snapshot-crds.sh"
cp "$gen/grafana/carve-dashboard.json" "$gen/helm/carve/files/carve-dashboard.json"
(cd "$root" && "$go" run ./hack/manifests --helm "$helm" --chart "$gen/helm/carve" --out "$gen/kubernetes" \
	--component "$gen/kubernetes/components/monitoring" --rules "$gen/prometheus/carve-rules.yaml")
if ! (cd "$root" && diff -ru deploy "$gen" >"$tmp/diff"); then
	sed "s|$gen|regenerated|g" "$tmp/diff"
	echo "verify: deploy/ is not what its sources generate (the diff above):" >&2
	echo "  run hack/snapshot-crds.sh, copy deploy/grafana/carve-dashboard.json to deploy/helm/carve/files/, then make manifests" >&2
	failed=1
fi

[ "$failed" = 0 ] || exit 1
echo "verify: api/, go.mod and deploy/ are what their sources generate" >&2
