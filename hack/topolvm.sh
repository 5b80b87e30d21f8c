#!/usr/bin/env bash
# Builds the peer make bench-peers runs beside carve: TopoLVM at the release
# pinned by test/tools/topolvm/go.mod, from the Go module proxy
# (hypertopolvm), with its own Helm chart (CRD included) rendered
# with test/peers/topolvm-values.yaml, into
# $CARVE_CACHE/topolvm/<version>-<hash>/ and prints that directory. <hash>
# covers the pins (not the go.mod's module line), the values and the Go
# version. Nothing of TopoLVM is
# committed. Needs helm (make deploy-tools) in $CARVE_CACHE/bin.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/test/tools/topolvm
values=$root/test/peers/topolvm-values.yaml
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
helm=${HELM:-$cache/bin/helm}

version=$(awk '$1 == "github.com/topolvm/topolvm" {print $2}' "$mod/go.mod")
hash=$( { grep -v '^module ' "$mod/go.mod"; cat "$mod/go.sum" "$values"; "$go" version; } | sha256sum | cut -c1-12)
out=$cache/topolvm/$version-$hash

if [ -x "$out/hypertopolvm" ] && [ -f "$out/topolvm.yaml" ]; then
	echo "topolvm $version: cached in $out" >&2
	echo "$out"
	exit 0
fi
[ -x "$helm" ] || { echo "topolvm: helm not found at $helm (make deploy-tools installs it)" >&2; exit 1; }

mkdir -p "$cache/topolvm"
tmp=$(mktemp -d "$cache/topolvm/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "topolvm $version: building hypertopolvm from the Go module proxy" >&2
(cd "$mod" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$tmp/hypertopolvm" github.com/topolvm/topolvm/cmd/hypertopolvm)
src=$(cd "$mod" && "$go" list -m -f '{{.Dir}}' github.com/topolvm/topolvm)
# The chart declares cert-manager as a subchart, and helm refuses to render
# a chart whose declared dependency is absent even when it is disabled:
# render a copy without the dependencies block.
cp -r "$src/charts/topolvm" "$tmp/chart"
chmod -R u+w "$tmp/chart"
rm -f "$tmp/chart/Chart.lock"
awk '/^dependencies:/ {skip=1; next} skip && /^[^ -]/ {skip=0} !skip' "$src/charts/topolvm/Chart.yaml" > "$tmp/chart/Chart.yaml"
"$helm" template topolvm "$tmp/chart" --namespace topolvm-system -f "$values" > "$tmp/topolvm.yaml"
rm -rf "$tmp/chart"

rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "topolvm $version: built in $(( $(date +%s) - start )) s into $out" >&2
echo "$out"
