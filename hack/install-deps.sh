#!/usr/bin/env bash
# Installs the Debian packages that the host, guest and end-to-end tiers need,
# only when something is missing. Needs root; fails with a clear message
# otherwise.
set -euo pipefail

# command-or-file -> package
declare -A need=(
  [lvm]=lvm2
  [qemu-system-x86_64]=qemu-system-x86
  [busybox]=busybox-static
  [thin_check]=thin-provisioning-tools
  [mkfs.xfs]=xfsprogs
  [mkfs.ext4]=e2fsprogs
  [mkfs.btrfs]=btrfs-progs
  [losetup]=util-linux
  [blkid]=util-linux
  [modprobe]=kmod
  [openssl]=openssl
  # Encrypted volumes (LUKS2): the guest tier's node agents run it.
  [cryptsetup]=cryptsetup-bin
  # make generate and make verify: hack/generate.sh checks its version.
  [protoc]=protobuf-compiler
  # Real kubelet nodes in guests (test/harness/guestnode): the container runtime,
  # the CNI plugins, and socat for qemu's per-connection forward to the
  # host's apiserver.
  [containerd]=containerd
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [socat]=socat
  # make image: buildah builds the Dockerfile with no daemon, mmdebstrap
  # makes its Debian base image (hack/image.sh).
  [buildah]=buildah
  [mmdebstrap]=mmdebstrap
)

missing=()
for cmd in "${!need[@]}"; do
  if [[ $cmd == /* ]]; then
    [ -e "$cmd" ] || missing+=("${need[$cmd]}")
  else
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
  fi
done
# The guest boots Debian's own kernel; its modules carry device-mapper.
if ! ls /boot/vmlinuz-* >/dev/null 2>&1 || ! ls -d /lib/modules/*/kernel/drivers/md >/dev/null 2>&1; then
  missing+=(linux-image-amd64)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: missing packages ${missing[*]}; run as root (make test installs them with apt-get)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Another apt run (a second make target) may hold dpkg's lock: wait for it.
apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >/dev/null
