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

// FormatResult tells what FormatAndMount did and how long each step took.
type FormatResult struct {
	// Probed: the signature was read; Probe is the time it took, failed or not.
	Probed bool
	Probe  time.Duration
	// Blank: the device read as zeros where signatures live; blkid did not run.
	Blank     bool
	Formatted bool
	Format    time.Duration
	// Mounted: the mount was attempted; Mount includes fsck.
	Mounted bool
	Mount   time.Duration
}

// FormatAndMount implements Interface; its steps are timed here.
func (f *FS) FormatAndMount(ctx context.Context, device, target, fsType string, options, mkfsOptions []string, check func(existing string) error) (FormatResult, error) {
	// Checked here too, so nothing unchecked reaches mkfs.
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

func (f *FS) formatAndMount(ctx context.Context, m mount.Interface, res *FormatResult, existing, device, target, fsType string, options, mkfsOptions []string) error {
	readOnly := slices.Contains(options, "ro")
	if existing == "" {
		// The one rule kept from mount-utils: only a device without any signature
		// is formatted, and never one to be mounted read-only.
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
	return m.MountSensitive(device, target, fsType, append(slices.Clone(options), "defaults"), nil)
}

// mkfs runs mkfs.<fsType>: the checked options, mount-utils' force flags.
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

const (
	fsckCorrected   = 1
	fsckUncorrected = 4
)

// fsck runs fsck -a before a read-write mount, as mount-utils does.
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

func (f *FS) signature(ctx context.Context, ex *contextExec, device string) (existing string, blank bool, err error) {
	blank, err = ReadsBlank(device)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Could not read the signature regions of the device; asking blkid", "device", device, "err", err)
	}
	if blank {
		return "", true, nil
	}
	existing, err = diskFormat(f.mounter, ex, device)
	return existing, false, err
}
