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

// HostMounter runs mount(8) and umount(8) under the request's context
// (mount-utils' own Mounter has none: a hung mount outlives its request).
type HostMounter struct {
	mount.Interface
	exec utilexec.Interface
	// mountInfoPath is empty for /proc/self/mountinfo.
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

// Mount runs under context.Background; FS never calls it.
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

// CanSafelySkipMountPointCheck is false: carve's umount does not ignore
// "not mounted".
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
	// A remount without the source's flags fails on a locked mount, obscurely.
	flags, err := sourceFlags(source)
	if err != nil {
		return err
	}
	if err := b.run(source, target, fsType, bindOpts, nil); err != nil {
		return err
	}
	// A bind ignores options: remount with them and the source's flags.
	remountOpts = append(remountOpts, flags...)
	err = b.run(source, target, fsType, remountOpts, remountSensitive)
	if err == nil {
		return nil
	}
	// Never leave the bind without its options, even when ctx ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), rollbackTimeout)
	defer cancel()
	if out, uerr := b.exec.CommandContext(ctx, "umount", target).CombinedOutput(); uerr != nil {
		return fmt.Errorf("%w; undoing the bind mount failed too, %s is mounted without its options: umount: %v: %s",
			err, target, uerr, strings.TrimSpace(string(out))) //nolint:errorlint // err is the failure; the rollback's is context
	}
	return fmt.Errorf("%w (the bind mount was undone)", err)
}

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

func (b *boundMounter) CanSafelySkipMountPointCheck() bool { return false }

func (b *boundMounter) Unmount(target string) error {
	out, err := b.exec.CommandContext(b.ctx, "umount", target).CombinedOutput()
	if err != nil {
		return fmt.Errorf("umount %s: %w: %s", target, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sourceFlags: a bind remount may not drop a locked mount's flags.
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
