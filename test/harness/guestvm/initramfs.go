package guestvm

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// initramfsFormat changes whenever the layout below changes, so that an
// older cached image is not reused.
const initramfsFormat = "guestvm-initramfs-v2"

// bootModules are loaded by the initramfs: what it takes to mount the 9p
// shares and the overlay. Their dependencies are added from modules.dep.
// Everything else (device-mapper, loop, filesystems) is loaded later with
// the host's own modprobe from the shared /lib/modules.
var bootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// Mount tags of the two 9p shares.
const (
	hostRootTag = "hostroot"
	workTag     = "carvework"
)

// GuestWorkDir is where the guest sees the per-run work directory (the
// read-write share). It is not under /tmp, which is a tmpfs in the guest.
const GuestWorkDir = "/carve"

// controlDir is the directory inside the work directory that holds the
// run script, the command's output and its exit status.
const controlDir = ".guestvm"

// initScript is the initramfs's /init. It runs busybox's sh; the guest's
// userland after the switch is the host's own. fail powers the guest off so
// that qemu ends at once instead of waiting for the timeout. It switches
// root rather than chrooting: under a bare chroot the initramfs stays the
// root mount, and a process that joins a mount namespace with setns (runc
// exec, so kubectl exec and exec probes) lands there with no /proc.
func initScript(modules []string) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "guestvm-init: $*"; echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger; sleep 30; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
`)
	for _, m := range modules {
		fmt.Fprintf(&b, "insmod /modules/%s || fail 'insmod %s'\n", path.Base(m), path.Base(m))
	}
	fmt.Fprintf(&b, `mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 %[1]s /host || fail 'mount 9p %[1]s'
mount -t tmpfs -o mode=0755 rw /rw || fail 'mount tmpfs'
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail 'mount overlay'
mkdir -p /newroot%[3]s
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 %[2]s /newroot%[3]s || fail 'mount 9p %[2]s'
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh %[3]s/%[4]s/run.sh
`, hostRootTag, workTag, GuestWorkDir, controlDir)
	return b.String()
}

// Initramfs returns the path of a gzip-compressed initramfs for k, building
// it when the cache holds none. The cache key covers the init script and
// every file that goes in, so a changed module or busybox gives a new image.
func Initramfs(k Kernel, cacheDir, busybox string) (string, error) {
	mods, err := k.ResolveModules(bootModules)
	if err != nil {
		return "", err
	}
	init := initScript(mods)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", initramfsFormat, init)
	for _, f := range append([]string{busybox}, absModules(k, mods)...) {
		st, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("guestvm: initramfs input: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
	}
	dir := filepath.Join(cacheDir, "guest", k.Version+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	out := filepath.Join(dir, "initramfs.cpio.gz")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	data, err := buildInitramfs(init, busybox, absModules(k, mods))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("guestvm: initramfs cache: %w", err)
	}
	// Write then rename, so that a concurrent run never reads half a file.
	tmp, err := os.CreateTemp(dir, "initramfs-*.tmp")
	if err != nil {
		return "", fmt.Errorf("guestvm: initramfs cache: %w", err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	// A failed Close of a written file is a lost write.
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return "", fmt.Errorf("guestvm: writing initramfs: %w", errors.Join(err, os.Remove(tmp.Name())))
	}
	return out, nil
}

func absModules(k Kernel, rel []string) []string {
	out := make([]string, len(rel))
	for i, m := range rel {
		out[i] = filepath.Join(k.ModulesDir, m)
	}
	return out
}

// buildInitramfs packs busybox, the modules and init into a gzipped newc
// cpio archive.
func buildInitramfs(init, busybox string, modules []string) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	// The cpio writer keeps its first error and Close returns it.
	c := newCPIOWriter(zw)
	for _, d := range []string{"bin", "dev", "proc", "sys", "host", "rw", "newroot", "modules", "tmp"} {
		c.Dir(d, 0o755)
	}
	// Without /dev/console in the archive the kernel starts init with no
	// console, and nothing the init prints is seen.
	c.CharDev("dev/console", 0o600, 5, 1)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("guestvm: reading busybox: %w", err)
	}
	c.File("bin/busybox", 0o755, bb)
	for _, m := range modules {
		data, err := os.ReadFile(m)
		if err != nil {
			return nil, fmt.Errorf("guestvm: reading module: %w", err)
		}
		c.File("modules/"+filepath.Base(m), 0o644, data)
	}
	c.File("init", 0o755, []byte(init))
	if err := c.Close(); err != nil {
		return nil, fmt.Errorf("guestvm: writing initramfs: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
