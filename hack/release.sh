#!/usr/bin/env bash
# Release artifacts of one version (make release-artifacts, make
# release-push-chart; the release workflow runs the same targets).
#
#   hack/release.sh artifacts   writes $DIST (default dist):
#     carve-X.Y.Z.tgz       the Helm chart, version and appVersion X.Y.Z (its
#                           default image is ghcr.io/carve-csi/carve:vX.Y.Z);
#                           the same archive is the OCI chart push-chart stores
#     index.yaml            a classic chart repository's index of it (URLs
#                           into the GitHub release of vX.Y.Z)
#     carve-vX.Y.Z.yaml     the kustomize base with the image of vX.Y.Z, for
#                           kubectl apply -f (the Namespace included)
#     RELEASE_NOTES.md      the CHANGELOG.md section of X.Y.Z
#     SHA256SUMS
#   hack/release.sh push-chart  helm push of the archive to $CHART_REGISTRY
#                               (oci://...; log in first: helm registry login)
#
# VERSION is the release tag, vX.Y.Z (a pre-release suffix is allowed).
# CHANGELOG.md (or $CHANGELOG) must have a "## [X.Y.Z]" section: a release
# says what changed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
helm=$cache/bin/helm
kustomize=$cache/bin/kustomize
dist=${DIST:-dist}
version=${VERSION:-}
die() { echo "release: $*" >&2; exit 1; }

[[ $version =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]] ||
	die "VERSION='$version': want a release tag vX.Y.Z (make release-artifacts VERSION=v1.2.3)"
semver=${BASH_REMATCH[1]}
for t in "$helm" "$kustomize"; do
	[ -x "$t" ] || die "$t is missing: make deploy-tools installs it"
done

case ${1:-} in
artifacts)
	notes=$(awk -v v="$semver" '
		/^## / { if (on) exit; if (index($0, "## [" v "]") == 1) { on = 1; next } }
		on { print }' "${CHANGELOG:-$root/CHANGELOG.md}")
	[ -n "$(echo "$notes" | tr -d '[:space:]')" ] ||
		die "CHANGELOG.md has no section \"## [$semver]\" (or it is empty): say what changed first"
	rm -rf "$dist"
	mkdir -p "$dist"
	dist=$(cd "$dist" && pwd)
	"$helm" lint --strict "$root/deploy/helm/carve" >/dev/null
	"$helm" package "$root/deploy/helm/carve" --version "$semver" --app-version "$semver" -d "$dist" >/dev/null
	"$helm" repo index "$dist" --url "https://github.com/carve-csi/carve/releases/download/$version"
	# kustomize takes a base only by a relative path.
	overlay=$(mktemp -d)
	trap 'rm -rf "$overlay"' EXIT
	cat >"$overlay/kustomization.yaml" <<-EOT
		resources:
		  - $(realpath --relative-to="$overlay" "$root/deploy/kubernetes")
		images:
		  - name: ghcr.io/carve-csi/carve
		    newTag: $version
	EOT
	"$kustomize" build "$overlay" >"$dist/carve-$version.yaml"
	echo "$notes" >"$dist/RELEASE_NOTES.md"
	(cd "$dist" && sha256sum -- *.tgz *.yaml >SHA256SUMS)
	ls -1 "$dist"
	;;
push-chart)
	registry=${CHART_REGISTRY:?CHART_REGISTRY=oci://<registry>/<path> is required}
	[ -f "$dist/carve-$semver.tgz" ] || die "$dist/carve-$semver.tgz is missing: make release-artifacts VERSION=$version first"
	"$helm" push "$dist/carve-$semver.tgz" "$registry" ${HELM_PUSH_FLAGS:-}
	;;
*)
	die "usage: hack/release.sh artifacts|push-chart (VERSION=vX.Y.Z)"
	;;
esac
