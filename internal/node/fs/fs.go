// Package fs formats, mounts, grows and measures carve's filesystems, through
// k8s.io/utils/exec bound to the caller's context.
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
	// FormatAndMount hands device's signature to check, whose error stops it;
	// then it formats a device without any signature (unless "ro"), or runs
	// fsck -a on an existing filesystem to be mounted read-write, and mounts.
	// Data is never formatted.
	FormatAndMount(ctx context.Context, device, target, fsType string, options, mkfsOptions []string, check func(existing string) error) (FormatResult, error)
	// Mount mounts source at target; "bind" binds, with "ro" by a remount.
	Mount(ctx context.Context, source, target, fsType string, options []string) error
	// Cleanup unmounts and removes target; a missing target is success.
	Cleanup(ctx context.Context, target string) error
	// MountPoint returns the mount at path, nil when there is none.
	MountPoint(path string) (*mount.MountPoint, error)
	// MountsOf returns the paths where device is mounted, bind mounts included.
	MountsOf(device string) ([]string, error)
	// Resize grows device's filesystem to the device; false without one.
	Resize(ctx context.Context, device, mountPath string) (bool, error)
	// Stats returns the usage of the filesystem that holds path.
	Stats(path string) (Stats, error)
	// DeviceSize returns the size in bytes of the block device at path.
	DeviceSize(ctx context.Context, path string) (uint64, error)
	// ProbeMkfs tells whether an mkfs of fsType on device ended.
	ProbeMkfs(ctx context.Context, device, fsType string) (MkfsState, error)
}

// Stats is the usage of a filesystem, in bytes and inodes.
type Stats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

// ContextMounter runs mount and umount under a context.
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

// New returns an FS; main passes NewHostMounter(exec) and utilexec.New().
func New(mounter mount.Interface, exec utilexec.Interface) *FS {
	return &FS{mounter: mounter, exec: exec}
}

func (f *FS) bind(ctx context.Context) (mount.Interface, *contextExec) {
	m := f.mounter
	if cm, ok := m.(ContextMounter); ok {
		m = cm.WithContext(ctx)
	}
	return m, &contextExec{ctx: ctx, exec: f.exec}
}

// DiskFormat returns blkid's type, "" without any signature.
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
	// The extensive check also sees a bind mount within one filesystem.
	if err := mount.CleanupMountPoint(target, m, true); err != nil {
		return fmt.Errorf("unmounting and removing %s: %w", target, err)
	}
	return nil
}

// MountPoint implements Interface. Only path is resolved; mount table
// entries are compared as the kernel prints them, never stat'ed: another
// pod's hung network mount must not hang carve.
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
	// The last entry wins: a later mount hides earlier ones.
	for i := len(mps) - 1; i >= 0; i-- {
		if p := tablePath(mps[i].Path); p == want || p == path {
			mp := mps[i]
			return &mp, nil
		}
	}
	return nil, nil
}

// tablePath drops the suffix the kernel adds for a deleted mount point.
func tablePath(p string) string { return strings.TrimSuffix(p, `\040(deleted)`) }

// MountsOf implements Interface, matching mountinfo device numbers (or a
// devtmpfs node's) where it can, else the source name. Only device and
// devtmpfs nodes are stat'ed, never another mount's paths.
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

// DeviceSize implements Interface with blockdev --getsize64, under ctx.
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

// SameDevice tells whether two of carve's device paths name one device
// (both /dev/<vg>/<lv> and /dev/mapper/<vg>-<lv> link to /dev/dm-N).
func SameDevice(a, b string) bool {
	return a == b || resolve(a) == resolve(b)
}

// sameSource resolves only sources under /dev (devtmpfs, in memory), so
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

// SameDeviceNode tells whether path is a device node for device.
func SameDeviceNode(path, device string) bool {
	var a, b unix.Stat_t
	if unix.Stat(path, &a) != nil || unix.Stat(device, &b) != nil {
		return false
	}
	return a.Mode&unix.S_IFMT == unix.S_IFBLK && b.Mode&unix.S_IFMT == unix.S_IFBLK && a.Rdev == b.Rdev
}

func resolve(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return filepath.Clean(p)
	}
	return r
}
