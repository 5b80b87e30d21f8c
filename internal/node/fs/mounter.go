package fs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// HostMounter is the mounter of a real node: mount-utils' Mounter reads the
// mount table and checks mount points, while mount(8) and umount(8) run
// through exec under the context of the request (mount-utils' own Mounter
// runs them without one, so a hung mount would outlive its request).
type HostMounter struct {
	mount.Interface
	exec utilexec.Interface
	// mountInfoPath is the mountinfo file MountInfo reads; empty means
	// /proc/self/mountinfo (tests name their own).
	mountInfoPath string
}

var _ ContextMounter = (*HostMounter)(nil)

// NewHostMounter returns the mounter main hands to New.
func NewHostMounter(exec utilexec.Interface) *HostMounter {
	return &HostMounter{Interface: mount.New(""), exec: exec}
}

// WithContext returns a mounter whose mount and umount commands run under ctx.
func (h *HostMounter) WithContext(ctx context.Context) mount.Interface {
	return &boundMounter{Interface: h.Interface, exec: h.exec, ctx: ctx}
}

// Mount without a context runs under context.Background; FS never calls it.
func (h *HostMounter) Mount(source, target, fsType string, options []string) error {
	return h.WithContext(context.Background()).Mount(source, target, fsType, options)
}

// MountSensitive: see Mount.
func (h *HostMounter) MountSensitive(source, target, fsType string, options, sensitive []string) error {
	return h.WithContext(context.Background()).MountSensitive(source, target, fsType, options, sensitive)
}

// Unmount: see Mount.
func (h *HostMounter) Unmount(target string) error {
	return h.WithContext(context.Background()).Unmount(target)
}

// CanSafelySkipMountPointCheck is false: mount-utils' Mounter answers true
// when its own Unmount ignores "not mounted", and then CleanupMountPoint
// unmounts without looking first. carve's umount runs through exec, so the
// mount point is checked before unmounting.
func (h *HostMounter) CanSafelySkipMountPointCheck() bool { return false }

type boundMounter struct {
	mount.Interface
	exec utilexec.Interface
	ctx  context.Context
}

func (b *boundMounter) Mount(source, target, fsType string, options []string) error {
	return b.MountSensitive(source, target, fsType, options, nil)
}

func (b *boundMounter) MountSensitive(source, target, fsType string, options, sensitive []string) error {
	bind, bindOpts, remountOpts, remountSensitive := mount.MakeBindOptsSensitive(options, sensitive)
	if !bind {
		return b.run(source, target, fsType, options, sensitive)
	}
	// Read before anything is mounted: a remount without the source's
	// flags fails on a locked mount with a message that hides the cause.
	flags, err := sourceFlags(source)
	if err != nil {
		return err
	}
	if err := b.run(source, target, fsType, bindOpts, nil); err != nil {
		return err
	}
	// A bind mount ignores options: apply them (ro, noatime, ...) with a
	// remount, keeping the flags the source has so the kernel accepts it.
	remountOpts = append(remountOpts, flags...)
	err = b.run(source, target, fsType, remountOpts, remountSensitive)
	if err == nil {
		return nil
	}
	// Never leave the bind without its options (a read-write mount where
	// read-only was asked): undo it, also when the request's context is
	// what ended, so a retry starts from nothing mounted.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), rollbackTimeout)
	defer cancel()
	if out, uerr := b.exec.CommandContext(ctx, "umount", target).CombinedOutput(); uerr != nil {
		return fmt.Errorf("%w; undoing the bind mount failed too, %s is mounted without its options: umount: %v: %s",
			err, target, uerr, strings.TrimSpace(string(out))) //nolint:errorlint // err is the failure; the rollback's is context
	}
	return fmt.Errorf("%w (the bind mount was undone)", err)
}

// rollbackTimeout bounds the umount that undoes a half-made bind mount.
const rollbackTimeout = 30 * time.Second

func (b *boundMounter) MountSensitiveWithoutSystemd(source, target, fsType string, options, sensitive []string) error {
	return b.MountSensitive(source, target, fsType, options, sensitive)
}

func (b *boundMounter) MountSensitiveWithoutSystemdWithMountFlags(source, target, fsType string, options, sensitive, _ []string) error {
	return b.MountSensitive(source, target, fsType, options, sensitive)
}

func (b *boundMounter) run(source, target, fsType string, options, sensitive []string) error {
	args, logged := mount.MakeMountArgsSensitive(source, target, fsType, options, sensitive)
	klog.V(4).InfoS("Mounting", "args", logged)
	out, err := b.exec.CommandContext(b.ctx, "mount", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount %s: %w: %s", logged, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// CanSafelySkipMountPointCheck: see HostMounter's.
func (b *boundMounter) CanSafelySkipMountPointCheck() bool { return false }

func (b *boundMounter) Unmount(target string) error {
	out, err := b.exec.CommandContext(b.ctx, "umount", target).CombinedOutput()
	if err != nil {
		return fmt.Errorf("umount %s: %w: %s", target, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sourceFlags are the flags of the filesystem holding source that a bind
// remount must repeat (the kernel refuses to drop nosuid, nodev, noexec on
// a locked mount).
func sourceFlags(source string) ([]string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(source, &st); err != nil {
		return nil, fmt.Errorf("reading the mount flags of bind mount source %s: statfs: %w", source, err)
	}
	var flags []string
	for _, f := range []struct {
		bit  int64
		name string
	}{{unix.ST_NOSUID, "nosuid"}, {unix.ST_NODEV, "nodev"}, {unix.ST_NOEXEC, "noexec"}} {
		if st.Flags&f.bit != 0 {
			flags = append(flags, f.name)
		}
	}
	return flags, nil
}
