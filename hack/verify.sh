#!/usr/bin/env bash
# Regenerates what deploy/ keeps generated, in a copy of deploy/, and fails
# when the copy differs from deploy/ as it is in the working tree (committed
# or not, which it never changes):
#   - the snapshot CRDs of the pinned external-snapshotter module in the
#     chart's files/snapshot-crds/ (hack/snapshot-crds.sh);
#   - the chart's copy of the Grafana dashboard, files/carve-dashboard.json,
#     from deploy/grafana;
#   - the kustomize base, its monitoring component and the plain rule file,
#     rendered from the chart (make manifests; after the CRDs, which the
#     base's snapshot-controller kustomization copies).
# `make verify` runs it. Needs helm ($HELM, default $CARVE_CACHE/bin/helm)
# and the pinned module (the Go module proxy the first time).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
helm=${HELM:-$cache/bin/helm}
[ -x "$helm" ] || { echo "verify: helm not found at $helm (make verify installs it)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
	exit 1
fi
echo "verify: deploy/ is what its sources generate" >&2
