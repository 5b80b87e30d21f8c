# Sourced, after hack/lib/images.sh, by the scripts that build images on a
# locally made Debian base (hack/image.sh, hack/postgres-image.sh): the
# recipe of debian:<release>-slim made with mmdebstrap in the private
# buildah store. The caller sets release (a Debian release name).
#
# After sourcing: debian_image and debian_key name the base and its recipe
# (the key covers the recipe only; the Debian archive's content on the day
# is not an input: it cannot be pinned without snapshot.debian.org). have
# and commit keep a base's image ID under its recipe's key; debian_base,
# called under the store's lock, makes the base unless the store holds it
# as the recipe makes it.

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
