// Package fs formats, mounts, grows and measures the filesystems of carve's
// volumes. FormatAndMount reads the signature (in-process when the device
// reads as zeros where one could be, else with blkid), formats only a device
// without any or checks an existing filesystem with fsck, and mounts;
// k8s.io/mount-utils parses blkid, mounts and grows. Every command runs
// through k8s.io/utils/exec bound to the caller's context, and the node
// server reaches it only through Interface (fakes in fstest).
package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// Interface is what carve's node server needs of filesystems and mounts.
type Interface interface {
	// FormatAndMount reads the signature on device once and hands it to check,
	// whose error it returns having done nothing else. Otherwise it formats
	// device with fsType only when it carries no signature and options do not
	// hold "ro" (mkfsOptions must pass ValidateMkfsOptions), or runs fsck -a on
	// an existing filesystem mounted read-write, then mounts it at target. A
	// device with data is never formatted.
	FormatAndMount(ctx context.Context, device, target, fsType string, options, mkfsOptions []string, check func(existing string) error) (FormatResult, error)
	// Mount mounts source at target; options holding "bind" make a bind
	// mount (with "ro" applied by a remount, as mount(8) requires).
	Mount(ctx context.Context, source, target, fsType string, options []string) error
	// Cleanup unmounts target if it is a mount point and removes it. A
	// target that does not exist is not an error, so repeated calls succeed.
	Cleanup(ctx context.Context, target string) error
	// MountPoint returns the mount at path, nil when path is not a mount
	// point (or does not exist).
	MountPoint(path string) (*mount.MountPoint, error)
	// MountsOf returns the paths where device is mounted (bind mounts
	// included), reading the mount table once.
	MountsOf(device string) ([]string, error)
	// Resize grows the filesystem on device, mounted at mountPath, to fill
	// the device (resize2fs, xfs_growfs, btrfs filesystem resize max). It
	// reports false when the device has no filesystem; growing a filesystem
	// that already fills its device succeeds.
	Resize(ctx context.Context, device, mountPath string) (bool, error)
	// Stats returns the usage of the filesystem that holds path.
	Stats(path string) (Stats, error)
	// DeviceSize returns the size in bytes of the block device at path.
	DeviceSize(ctx context.Context, path string) (uint64, error)
	// ProbeMkfs tells whether an mkfs of fsType begun on device ended
	// (MkfsFinished: the filesystem may hold data), did not
	// (MkfsUnfinished), or left no superblock of fsType (NoFilesystem).
	ProbeMkfs(ctx context.Context, device, fsType string) (MkfsState, error)
}

// Stats is the usage of a filesystem, in bytes and inodes.
type Stats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

// ContextMounter is a mount.Interface that can run its mount and umount
// commands bound to a context. FS uses WithContext when its mounter
// implements it (HostMounter does; mount-utils' FakeMounter does not need to).
type ContextMounter interface {
	mount.Interface
	WithContext(ctx context.Context) mount.Interface
}

// FS implements Interface with a mounter and an exec.
type FS struct {
	mounter mount.Interface
	exec    utilexec.Interface
}

var _ Interface = (*FS)(nil)

// New returns an FS. main passes NewHostMounter(exec) and utilexec.New();
// tests pass mount-utils' FakeMounter and a fake exec.
func New(mounter mount.Interface, exec utilexec.Interface) *FS {
	return &FS{mounter: mounter, exec: exec}
}

// bind returns the mounter and exec to use for one call under ctx.
func (f *FS) bind(ctx context.Context) (mount.Interface, *contextExec) {
	m := f.mounter
	if cm, ok := m.(ContextMounter); ok {
		m = cm.WithContext(ctx)
	}
	return m, &contextExec{ctx: ctx, exec: f.exec}
}

// DiskFormat returns the filesystem type blkid finds on device, "" when
// the device carries no signature at all, and a non-empty description for
// other data (a partition table).
func (f *FS) DiskFormat(ctx context.Context, device string) (string, error) {
	m, ex := f.bind(ctx)
	return diskFormat(m, ex, device)
}

func diskFormat(m mount.Interface, ex *contextExec, device string) (string, error) {
	format, err := mount.NewSafeFormatAndMount(m, ex).GetDiskFormat(device)
	if err != nil {
		return "", fmt.Errorf("reading the signature of %s: %w", device, err)
	}
	return format, nil
}

// Mount implements Interface.
func (f *FS) Mount(ctx context.Context, source, target, fsType string, options []string) error {
	m, _ := f.bind(ctx)
	if err := m.Mount(source, target, fsType, options); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", source, target, err)
	}
	return nil
}

// Cleanup implements Interface.
func (f *FS) Cleanup(ctx context.Context, target string) error {
	m, _ := f.bind(ctx)
	// The extensive check reads the mount table, so a bind mount within
	// the same filesystem is seen too.
	if err := mount.CleanupMountPoint(target, m, true); err != nil {
		return fmt.Errorf("unmounting and removing %s: %w", target, err)
	}
	return nil
}

// MountPoint implements Interface. Only path itself is resolved (it is
// carve's own staging or target path); the entries of the mount table are
// compared as the kernel prints them (canonical, symlink-free paths), never
// stat'ed: another pod's hung network mount must not hang carve.
func (f *FS) MountPoint(path string) (*mount.MountPoint, error) {
	want, err := filepath.EvalSymlinks(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		want = filepath.Clean(path)
	}
	mps, err := f.mounter.List()
	if err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	// The last entry wins: a later mount over the same path hides the
	// earlier ones.
	for i := len(mps) - 1; i >= 0; i-- {
		if p := tablePath(mps[i].Path); p == want || p == path {
			mp := mps[i]
			return &mp, nil
		}
	}
	return nil, nil
}

// tablePath is a mount table path without the suffix the kernel adds when
// the mount point was deleted.
func tablePath(p string) string { return strings.TrimSuffix(p, `\040(deleted)`) }

// MountsOf implements Interface. With a mounter that reads mountinfo
// (HostMounter), a mount is device's when its device numbers are device's,
// or, for a device node bind-mounted from devtmpfs (a raw block volume),
// when the node it shows is device's; otherwise the mount's source is
// compared by name. Either way only device and nodes under devtmpfs are
// stat'ed, never another mount's mount point or source.
func (f *FS) MountsOf(device string) ([]string, error) {
	if mi, ok := f.mounter.(MountInfoLister); ok {
		infos, err := mi.MountInfo()
		if err != nil {
			return nil, fmt.Errorf("listing mounts: %w", err)
		}
		return mountsOfDevice(infos, device)
	}
	mps, err := f.mounter.List()
	if err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	var paths []string
	for _, mp := range mps {
		if sameSource(mp.Device, device) {
			paths = append(paths, tablePath(mp.Path))
		}
	}
	return paths, nil
}

// Resize implements Interface.
func (f *FS) Resize(ctx context.Context, device, mountPath string) (bool, error) {
	_, ex := f.bind(ctx)
	ok, err := mount.NewResizeFs(ex).Resize(device, mountPath)
	if err != nil {
		return false, fmt.Errorf("growing the filesystem of %s at %s: %w", device, mountPath, err)
	}
	return ok, nil
}

// DeviceSize implements Interface with blockdev --getsize64, the same tool
// mount-utils uses, so it runs under the caller's context.
func (f *FS) DeviceSize(ctx context.Context, path string) (uint64, error) {
	out, err := f.exec.CommandContext(ctx, "blockdev", "--getsize64", path).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return 0, fmt.Errorf("reading the size of %s: %w: %s", path, err, s)
	}
	size, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading the size of %s: blockdev printed %q", path, s)
	}
	return size, nil
}

// SameDevice tells whether two device paths name the same device:
// /dev/<vg>/<lv> and /dev/mapper/<vg>-<lv> are both links to /dev/dm-N.
// Callers pass their own device and the source of a mount at their own
// path; MountsOf, which looks at every mount, uses sameSource.
func SameDevice(a, b string) bool {
	return a == b || resolve(a) == resolve(b)
}

// sameSource tells whether a mount's source names device. The source is
// resolved only when it lies under /dev (devtmpfs, in memory): any other
// source (server:/export, a FUSE name) is compared as a string, so that
// nothing on another mount is looked up.
func sameSource(source, device string) bool {
	if source == device {
		return true
	}
	dev := resolve(device)
	if source == dev {
		return true
	}
	return strings.HasPrefix(source, "/dev/") && resolve(source) == dev
}

// SameDeviceNode tells whether path is a device node for the same device
// as device (a bind-mounted device node is one).
func SameDeviceNode(path, device string) bool {
	var a, b unix.Stat_t
	if unix.Stat(path, &a) != nil || unix.Stat(device, &b) != nil {
		return false
	}
	return a.Mode&unix.S_IFMT == unix.S_IFBLK && b.Mode&unix.S_IFMT == unix.S_IFBLK && a.Rdev == b.Rdev
}

// resolve follows symbolic links, returning p itself when it cannot.
func resolve(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return filepath.Clean(p)
	}
	return r
}
