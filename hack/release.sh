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
#     kubectl-carve-vX.Y.Z-<os>-<arch>.tar.gz
#                           kubectl-carve, kubectl_complete-carve (its shell
#                           completion helper) and LICENSE, for each of
#                           $PLATFORMS (default linux/amd64 linux/arm64
#                           darwin/amd64 darwin/arm64; CGO_ENABLED=0 builds)
#     carve.krew.yaml       krew's plugin manifest of those archives
#                           (deploy/krew/carve.yaml with the version, the
#                           release's download URLs and the sha256 of each)
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
go=${GO:-go}
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
download=https://github.com/carve-csi/carve/releases/download
dist=${DIST:-dist}
version=${VERSION:-}
die() { echo "release: $*" >&2; exit 1; }

[[ $version =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]] ||
	die "VERSION='$version': want a release tag vX.Y.Z (make release-artifacts VERSION=v1.2.3)"
semver=${BASH_REMATCH[1]}
for t in "$helm" "$kustomize"; do
	[ -x "$t" ] || die "$t is missing: make deploy-tools installs it"
done

# plugin <work dir>: the kubectl-carve archives of $platforms and krew's
# manifest of them into $dist. The archives are reproducible: fixed
# owner, order and time (the commit's, else 0), gzip without a name.
plugin() {
	local work=$1 epoch platform os arch name entries="" sum
	epoch=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
	for platform in $platforms; do
		os=${platform%/*}
		arch=${platform#*/}
		name=kubectl-carve-$version-$os-$arch
		mkdir -p "$work/$name"
		(cd "$root" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$go" build -trimpath \
			-ldflags "-s -w -X github.com/carve-csi/carve/internal/version.Version=$version" \
			-o "$work/$name/kubectl-carve" ./cmd/kubectl-carve)
		install -m 0755 "$root/cmd/kubectl-carve/kubectl_complete-carve" "$work/$name/"
		install -m 0644 "$root/LICENSE" "$work/$name/"
		tar -C "$work/$name" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
			-c kubectl-carve kubectl_complete-carve LICENSE | gzip -n >"$dist/$name.tar.gz"
		sum=$(sha256sum "$dist/$name.tar.gz" | cut -d' ' -f1)
		entries+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $download/$version/$name.tar.gz
    sha256: $sum
    files:
      - from: kubectl-carve
        to: .
      - from: kubectl_complete-carve
        to: .
      - from: LICENSE
        to: .
    bin: kubectl-carve
"
	done
	[ -n "$entries" ] || die "PLATFORMS is empty: want os/arch pairs (linux/amd64 ...)"
	# The template's comment is for this repository, not the manifest.
	awk -v v="$version" -v p="${entries%$'\n'}" '
		/^#/ && !body { next }
		{ body = 1; gsub(/@VERSION@/, v) }
		$0 == "@PLATFORMS@" { print p; next }
		{ print }' "$root/deploy/krew/carve.yaml" >"$dist/carve.krew.yaml"
}

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
	"$helm" repo index "$dist" --url "$download/$version"
	# kustomize takes a base only by a relative path.
	overlay=$(mktemp -d)
	trap 'rm -rf "$overlay"' EXIT
	plugin "$overlay/plugin"
	cat >"$overlay/kustomization.yaml" <<-EOT
		resources:
		  - $(realpath --relative-to="$overlay" "$root/deploy/kubernetes")
		images:
		  - name: ghcr.io/carve-csi/carve
		    newTag: $version
	EOT
	"$kustomize" build "$overlay" >"$dist/carve-$version.yaml"
	echo "$notes" >"$dist/RELEASE_NOTES.md"
	(cd "$dist" && sha256sum -- *.tgz *.tar.gz *.yaml >SHA256SUMS)
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
