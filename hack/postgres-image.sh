#!/usr/bin/env bash
# Builds the PostgreSQL image the database tier runs (make test-databases;
# test material, not something carve ships): Debian's postgresql-15 on the
# same locally made debian:<release>-slim as carve's image (the Dockerfile's
# DEBIAN_RELEASE; hack/lib/debian-base.sh), daemonless with buildah, as an
# OCI archive that `ctr images import` takes as localhost/carve-test/postgres:15.
# Prints the archive's path on stdout; progress goes to stderr. Root.
#
#   $CARVE_CACHE/images/postgres/<key>/postgres.tar
#
# <key> covers this script, the base's recipe and the archive writer's
# sources. As with the base, the Debian archive's content on the day is not
# an input. A warm run (same key) does nothing.
#
# The image is as small as Debian's packages allow: no documentation or
# locales (the base's dpkg filters, and no locale sources: the tests'
# clusters use the C locale), none of apt's lists, one layer, and without what
# only PostgreSQL's LLVM JIT needs (llvmjit.so, its bitcode, libllvm and
# the libraries only libllvm uses: PostgreSQL runs without JIT when
# llvmjit.so is absent), nor perl (only postgresql-common's wrapper
# scripts use it; the tests call the binaries in /usr/lib/postgresql/15/bin,
# which the image puts on PATH).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CARVE_CACHE:-$HOME/.cache/carve}
go=${GO:-go}
images=$cache/images
name=localhost/carve-test/postgres:15
major=15

t0=$(date +%s)
say() { echo "postgres-image: [$(($(date +%s) - t0)) s] $*" >&2; }
die() { echo "postgres-image: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (buildah's chroot isolation)"
for c in buildah mmdebstrap flock sha256sum; do
	command -v "$c" >/dev/null || die "$c is missing: run make deps (hack/install-deps.sh)"
done

release=$(sed -n 's/^ARG DEBIAN_RELEASE=\(.*\)$/\1/p' "$root/Dockerfile")
[ -n "$release" ] || die "the Dockerfile has no ARG DEBIAN_RELEASE="
# shellcheck source=hack/lib/images.sh
. "$root/hack/lib/images.sh"
# shellcheck source=hack/lib/debian-base.sh
. "$root/hack/lib/debian-base.sh"

# Installed, then what the database never runs taken out again (dpkg
# --force-depends: the packages that depend on them stay installed).
packages=(postgresql-$major postgresql-client-$major)
unneeded=(libllvm14 libz3-4 perl perl-modules-5.36 libperl5.36 libgdbm6 libgdbm-compat4 ssl-cert postgresql-common)

mapfile -t srcs < <(go_sources ./test/harness/ociimage/cmd/ociarchive)
key=$(cache_key go.mod go.sum hack/postgres-image.sh hack/lib/images.sh hack/lib/debian-base.sh "${srcs[@]}" \
	-- "$name" "$debian_key" "${packages[@]}" "${unneeded[@]}")
out=$images/postgres/$key

mkdir -p "$images/postgres"
exit_if_cached "$out/postgres.tar"
start=$(date +%s)
debian_base

say "installing ${packages[*]} on $debian_image"
c=$(bah from --pull-never "$debian_image")
bah run "$c" -- apt-get update -qq
# postgresql-common makes no cluster at install: the tests make their own
# (initdb --data-checksums) on a carve volume.
bah run "$c" -- mkdir -p /etc/postgresql-common
bah run "$c" -- sh -c 'echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf'
bah run --env DEBIAN_FRONTEND=noninteractive "$c" -- apt-get install -qq -y --no-install-recommends \
	-o Dpkg::Options::=--force-confold "${packages[@]}" >/dev/null
bah run "$c" -- dpkg --purge --force-depends "${unneeded[@]}" >/dev/null 2>&1
bah run "$c" -- sh -c "rm -rf /usr/lib/postgresql/$major/lib/llvmjit* /usr/lib/postgresql/$major/lib/bitcode \
	/var/lib/apt/lists/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log /var/log/alternatives.log \
	/usr/share/postgresql/$major/man /usr/share/postgresql-common /usr/share/i18n \
	&& mkdir -p /var/lib/apt/lists/partial"
# Every binary the tests run resolves its libraries without what was taken out.
bah run "$c" -- sh -c "for f in /usr/lib/postgresql/$major/bin/*; do if ldd \"\$f\" | grep -q 'not found'; then echo \"\$f: \$(ldd \"\$f\" | grep 'not found')\"; exit 1; fi; done"
bah config --env PATH=/usr/lib/postgresql/$major/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--env PGDATA=/data/pgdata --cmd "postgres" "$c"
# One layer: what the base holds and this build took out again (perl)
# is not in the archive at all.
bah commit --quiet --squash --rm "$c" "$name" >/dev/null
say "built; writing the archive"
oci_archive "$name" postgres.tar
rm -rf "$out"
mv "$tmp/out" "$out"
keep_newest "$images/postgres" 2
say "built in $(($(date +%s) - start)) s: $out/postgres.tar ($(du -m "$out/postgres.tar" | cut -f1) MB)"
echo "$out/postgres.tar"
