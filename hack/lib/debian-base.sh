# Sourced by the scripts that build images daemonless (hack/image.sh,
# hack/postgres-image.sh): the private buildah store under $images and the
# recipe of debian:<release>-slim made there with mmdebstrap. The caller
# sets images (the store's directory), release (a Debian release name),
# say and die, and is root.
#
# After sourcing: debian_image and debian_key name the base and its recipe
# (the key covers the recipe only; the Debian archive's content on the day
# is not an input: it cannot be pinned without snapshot.debian.org).
# store_lock takes the store (one build at a time) and sets up bah, have,
# commit and $tmp (removed on exit); debian_base makes the base unless the
# store holds it as the recipe makes it.

mirror=http://deb.debian.org
debian_sources=(
	"deb $mirror/debian $release main"
	"deb $mirror/debian $release-updates main"
	"deb $mirror/debian-security $release-security main"
)
# As the official slim images: no documentation or locales.
debian_dpkgopts=(
	'path-exclude=/usr/share/man/*'
	'path-exclude=/usr/share/doc/*'
	'path-include=/usr/share/doc/*/copyright'
	'path-exclude=/usr/share/locale/*'
	'path-exclude=/usr/share/info/*'
)
# As the official images: apt keeps no downloaded packages or binary
# caches, so a Dockerfile's apt-get install leaves only what it installed.
apt_clean='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'
debian_aptopts=(
	"DPkg::Post-Invoke { \"$apt_clean\"; }"
	"APT::Update::Post-Invoke { \"$apt_clean\"; }"
	'Dir::Cache::pkgcache ""'
	'Dir::Cache::srcpkgcache ""'
	'Acquire::Languages "none"'
)
debian_image=docker.io/library/debian:$release-slim
debian_key=$(printf '%s\n' v2 minbase "$release" "${debian_sources[@]}" "${debian_dpkgopts[@]}" "${debian_aptopts[@]}" | sha256sum | cut -c1-16)

bah() { buildah --root "$images/buildah/root" --runroot "$images/buildah/run" --storage-driver vfs "$@"; }

# have NAME KEY: the store holds NAME as made by the recipe with KEY.
have() {
	local stamp=$images/bases/$2 id
	[ -f "$stamp" ] || return 1
	id=$(bah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null) || return 1
	[ "sha256:${id#sha256:}" = "$(cat "$stamp")" ]
}

# commit CONTAINER NAME KEY: commits, records the image ID under KEY and
# drops the image NAME named before.
commit() {
	local old
	old=$(bah inspect --type image --format '{{.FromImageID}}' "$2" 2>/dev/null || true)
	bah commit --quiet --rm --iidfile "$images/bases/$3.tmp" "$1" "$2" >/dev/null
	mv "$images/bases/$3.tmp" "$images/bases/$3"
	if [ -n "$old" ] && [ "sha256:${old#sha256:}" != "$(cat "$images/bases/$3")" ]; then bah rmi "$old" >/dev/null 2>&1 || true; fi
}

# store_lock: waits for the store (fd 9 holds the lock until exit), points
# buildah at a private registries.conf (nothing of the machine's containers
# setup is read or changed; short names resolve to docker.io only), drops
# working containers an interrupted run left and makes $tmp.
store_lock() {
	mkdir -p "$images/bases"
	exec 9>"$images/.lock"
	flock 9
	cat >"$images/registries.conf" <<'CONF'
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
CONF
	export CONTAINERS_REGISTRIES_CONF=$images/registries.conf
	export BUILDAH_ISOLATION=chroot
	bah rm --all >/dev/null
	tmp=$(mktemp -d "$images/build.XXXXXX")
	trap 'rm -rf "$tmp"; bah rm --all >/dev/null 2>&1 || true' EXIT
}

# debian_base: makes $debian_image unless the store has it.
debian_base() {
	have "$debian_image" "$debian_key" && return 0
	say "making $debian_image (mmdebstrap --variant=minbase $release)"
	local opts=() o c
	for o in "${debian_dpkgopts[@]}"; do opts+=(--dpkgopt="$o"); done
	for o in "${debian_aptopts[@]}"; do opts+=(--aptopt="$o"); done
	mmdebstrap --quiet --variant=minbase "${opts[@]}" "$release" "$tmp/debian.tar" "${debian_sources[@]}"
	c=$(bah from scratch)
	bah add --quiet "$c" "$tmp/debian.tar" / >/dev/null
	rm -f "$tmp/debian.tar"
	bah config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
	commit "$c" "$debian_image" "$debian_key"
}
