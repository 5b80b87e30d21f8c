# Sourced by the scripts that keep image archives under $images
# (hack/image.sh, hack/postgres-image.sh, hack/images.sh): how a cache entry
# is keyed, found, built under the store's lock and written. The caller
# sets root (the repository), images ($CARVE_CACHE/images), go, say and die.

# go_sources [GO LIST FLAG...] PACKAGE...: the repository's files that the
# packages are built from (Go and embedded files, CGO_ENABLED=0, as the
# images build them), relative to $root, sorted.
go_sources() {
	(cd "$root" && CGO_ENABLED=0 "$go" list -deps -f \
		'{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}' "$@") |
		sed "s|^$root/||" | sort -u
}

# cache_key FILE... [-- WORD...]: 16 hex digits over the files' names and
# contents (relative to $root) and the words, one a line. A key is the name
# of a cache entry: whatever changes the entry's content must be a file or
# a word here.
cache_key() {
	local files=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	{
		(cd "$root" && sha256sum "${files[@]}")
		[ $# -eq 0 ] || printf '%s\n' "$@"
	} | sha256sum | cut -c1-16
}

# bah: buildah on the private store; nothing of the machine's containers
# storage is read or changed.
bah() { buildah --root "$images/buildah/root" --runroot "$images/buildah/run" --storage-driver vfs "$@"; }

# exit_if_cached FILE...: when every FILE exists, before or after waiting
# for the store's lock (a build beside this one may have made them
# meanwhile), prints the first and ends the script with status 0.
# Otherwise returns holding the lock (store_lock), and the caller builds.
# It exits rather than returns a status so that it runs with errexit on,
# which a function called as a condition would not.
exit_if_cached() {
	if all_exist "$@"; then
		say "cached: $1"
		echo "$1"
		exit 0
	fi
	store_lock
	if all_exist "$@"; then
		say "built beside this run: $1"
		echo "$1"
		exit 0
	fi
	say "store locked"
}

all_exist() {
	local f
	for f in "$@"; do [ -f "$f" ] || return 1; done
}

# store_lock: waits for the store (fd 9 holds the lock until exit), points
# buildah at a private registries.conf (nothing of the machine's containers
# setup is read or changed; short names resolve to docker.io only), drops
# working containers an interrupted run left and makes $tmp, removed on
# exit.
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

# oci_archive NAME FILE: writes the store's image NAME to $tmp/out/FILE, a
# single-image OCI archive named NAME for `ctr images import`, and drops
# NAME from the store. Layers go uncompressed: a guest under TCG spends
# longer inflating gzip than reading twice the bytes.
oci_archive() {
	rm -rf "$tmp/layout"
	bah push --quiet "$1" "oci:$tmp/layout:$1"
	bah rmi "$1" >/dev/null
	bah rmi --prune >/dev/null 2>&1 || true
	mkdir -p "$tmp/out"
	(cd "$root" && CGO_ENABLED=0 "$go" run ./test/harness/ociimage/cmd/ociarchive layout -uncompressed -name "$1" -o "$tmp/out/$2" "$tmp/layout")
}

# keep_newest DIR N: removes all but the N newest entries of DIR.
keep_newest() {
	ls -1dt "$1"/*/ | tail -n +$(($2 + 1)) | xargs -r rm -rf
}
