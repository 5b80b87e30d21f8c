package fs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// FormatResult tells what FormatAndMount did and how long each step took,
// as timed where the step ran.
type FormatResult struct {
	// Probed is true when the signature was read; Probe is the time
	// spent reading it (ReadsBlank, then blkid unless the device read as
	// blank), whether it was read or failed.
	Probed bool
	Probe  time.Duration
	// Blank is true when the device read as zeros where signatures live,
	// so blkid did not run.
	Blank bool
	// Formatted is true when mkfs ran.
	Formatted bool
	// Format is the time spent in mkfs (zero when it did not run).
	Format time.Duration
	// Mounted is true when the mount was attempted (mkfs succeeded or was
	// not needed, fsck found nothing it could not correct); Mount is the
	// time the step took, fsck included when it ran.
	Mounted bool
	Mount   time.Duration
}

// FormatAndMount implements Interface. Its steps, each timed here: read
// the signature (signature), let check refuse it, make the filesystem on
// a device with no signature at all (mkfs), or check an existing one
// (fsck, unless mounted read-only), then mount.
func (f *FS) FormatAndMount(ctx context.Context, device, target, fsType string, options, mkfsOptions []string, check func(existing string) error) (FormatResult, error) {
	// Checked here too, so that nothing unchecked reaches mkfs whoever
	// the caller is.
	if err := ValidateMkfsOptions(fsType, mkfsOptions); err != nil {
		return FormatResult{}, fmt.Errorf("mkfs options of %s: %w", fsType, err)
	}
	m, ex := f.bind(ctx)
	var res FormatResult
	start := time.Now()
	existing, blank, err := f.signature(ctx, ex, device)
	res.Probe, res.Blank = time.Since(start), blank
	if err != nil {
		return res, err
	}
	res.Probed = true
	if err := check(existing); err != nil {
		return res, err
	}
	if err := f.formatAndMount(ctx, m, &res, existing, device, target, fsType, options, mkfsOptions); err != nil {
		return res, fmt.Errorf("formatting and mounting %s at %s: %w", device, target, err)
	}
	return res, nil
}

// formatAndMount is FormatAndMount after the check: mkfs or fsck, then
// mount, filling res.
func (f *FS) formatAndMount(ctx context.Context, m mount.Interface, res *FormatResult, existing, device, target, fsType string, options, mkfsOptions []string) error {
	readOnly := slices.Contains(options, "ro")
	if existing == "" {
		// The one rule kept from mount-utils: only a device without any
		// signature is formatted, and never one to be mounted read-only.
		if readOnly {
			return fmt.Errorf("the device has no filesystem and is to be mounted read-only: not formatting it")
		}
		res.Formatted = true
		start := time.Now()
		err := f.mkfs(ctx, device, fsType, mkfsOptions)
		res.Format = time.Since(start)
		if err != nil {
			return err
		}
	}
	start := time.Now()
	defer func() { res.Mount = time.Since(start) }()
	if existing != "" && !readOnly {
		if err := f.fsck(ctx, device); err != nil {
			return err
		}
	}
	res.Mounted = true
	// "defaults" as mount-utils adds it; options is the caller's slice.
	return m.MountSensitive(device, target, fsType, append(slices.Clone(options), "defaults"), nil)
}

// mkfs makes a filesystem of fsType on device: the options (checked by
// ValidateMkfsOptions) first, then the force flags mount-utils gives
// (-F -m0 for ext4, -f for xfs), then the device.
func (f *FS) mkfs(ctx context.Context, device, fsType string, options []string) error {
	args := slices.Clone(options)
	switch fsType {
	case "ext4", "ext3":
		args = append(args, "-F", "-m0")
	case "xfs":
		args = append(args, "-f")
	}
	args = append(args, device)
	klog.FromContext(ctx).Info("Formatting a device that has no signature", "device", device, "fsType", fsType, "args", args)
	out, err := f.exec.CommandContext(ctx, "mkfs."+fsType, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.%s: %w: %s", fsType, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fsck exit statuses (fsck(8)).
const (
	fsckCorrected   = 1
	fsckUncorrected = 4
)

// fsck repairs what fsck -a can on device before it is mounted read-write,
// as mount-utils does: only errors it could not correct stop the mount; a
// missing fsck or any other failure is logged and the mount goes on.
func (f *FS) fsck(ctx context.Context, device string) error {
	log := klog.FromContext(ctx).WithValues("device", device)
	out, err := f.exec.CommandContext(ctx, "fsck", "-a", device).CombinedOutput()
	if err == nil {
		return nil
	}
	var exit utilexec.ExitError
	isExit := errors.As(err, &exit)
	switch {
	case errors.Is(err, utilexec.ErrExecutableNotFound):
		log.Info("No fsck on this system; mounting without checking the filesystem")
	case isExit && exit.ExitStatus() == fsckCorrected:
		log.Info("fsck corrected errors on the device")
	case isExit && exit.ExitStatus() == fsckUncorrected:
		return fmt.Errorf("fsck found errors on %s that it could not correct: %s", device, strings.TrimSpace(string(out)))
	default:
		log.Info("fsck failed; mounting all the same", "err", err, "output", strings.TrimSpace(string(out)))
	}
	return nil
}

// signature reads what is on device: a device that reads as zeros where
// signatures live (ReadsBlank) has none, and blkid does not run; anything
// else is read by blkid (DiskFormat), which names a filesystem or a
// partition table, or finds no signature among leftover data. blank tells
// which way was taken.
func (f *FS) signature(ctx context.Context, ex *contextExec, device string) (existing string, blank bool, err error) {
	blank, err = ReadsBlank(device)
	if err != nil {
		// blkid decides, as it did before the read: a device it
		// cannot read either stops the stage there.
		klog.FromContext(ctx).V(2).Info("Could not read the signature regions of the device; asking blkid", "device", device, "err", err)
	}
	if blank {
		return "", true, nil
	}
	existing, err = diskFormat(f.mounter, ex, device)
	return existing, false, err
}
