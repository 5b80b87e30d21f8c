package fs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"

	"github.com/carve-csi/carve/internal/node/directio"
)

// MkfsState is what ProbeMkfs finds on a device whose mkfs may not have
// ended.
type MkfsState int

const (
	// NoFilesystem: no superblock of the filesystem type (a blank device,
	// leftovers, another signature, or a type ProbeMkfs does not read).
	NoFilesystem MkfsState = iota
	// MkfsUnfinished: what an mkfs that never ended left: an xfs whose
	// superblock is still flagged in progress (sb_inprogress, which the
	// kernel refuses to mount), or an ext2/3/4 never mounted that does not
	// check clean (e2fsck -n -f). It holds nobody's data.
	MkfsUnfinished
	// MkfsFinished: a filesystem an mkfs finished; it may hold data.
	MkfsFinished
)

func (s MkfsState) String() string {
	switch s {
	case MkfsUnfinished:
		return "unfinished"
	case MkfsFinished:
		return "finished"
	}
	return "none"
}

// superblockHead is how much of a device ProbeMkfs reads: xfs's
// superblock is at 0, ext2/3/4's at 1024 (1024 bytes).
const superblockHead = 4096

// Superblock fields ProbeMkfs reads (xfs_format.h's xfs_dsb; ext4.h's
// ext4_super_block, at its offset 1024 on the device).
const (
	xfsMagic         = "XFSB"
	xfsInProgressOff = 126 // sb_inprogress: set by mkfs.xfs until it ends

	extSuperblock = 1024
	extMagicOff   = extSuperblock + 56 // s_magic
	extMagic      = 0xEF53
	extMtimeOff   = extSuperblock + 44 // s_mtime: the last mount
	extMntOff     = extSuperblock + 52 // s_mnt_count: mounts since the last check
)

// HeadReader reads the first n bytes of a device. An exec passed to New
// that implements it (fstest's fake) is used in place of the device.
type HeadReader interface {
	ReadHead(device string, n int) ([]byte, error)
}

// ProbeMkfs tells whether the mkfs of fsType that a stage began on device
// ended: it reads the superblock, and runs e2fsck -n -f (read-only) on an
// ext2/3/4 that was never mounted. A stage that finds its formatting mark
// asks it before anything is zeroed: only MkfsUnfinished may be.
func (f *FS) ProbeMkfs(ctx context.Context, device, fsType string) (MkfsState, error) {
	head, err := f.readHead(device)
	if err != nil {
		return NoFilesystem, err
	}
	state, check := mkfsStateOf(head, fsType)
	if !check {
		return state, nil
	}
	out, err := f.exec.CommandContext(ctx, "e2fsck", "-n", "-f", device).CombinedOutput()
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return MkfsFinished, nil
	case errors.Is(err, utilexec.ErrExecutableNotFound):
		klog.FromContext(ctx).Info("No e2fsck on this system; taking the never-mounted filesystem for a finished one", "device", device)
		return MkfsFinished, nil
	case errors.As(err, &exit):
		klog.FromContext(ctx).Info("A never-mounted filesystem does not check clean: the remains of an unfinished mkfs",
			"device", device, "exitStatus", exit.ExitStatus(), "output", strings.TrimSpace(string(out)))
		return MkfsUnfinished, nil
	}
	return NoFilesystem, fmt.Errorf("e2fsck -n -f %s: %w", device, err)
}

// mkfsStateOf reads the superblock of fsType in head (the device's first
// bytes); check says that e2fsck must decide.
func mkfsStateOf(head []byte, fsType string) (state MkfsState, check bool) {
	switch fsType {
	case "xfs":
		if len(head) <= xfsInProgressOff || string(head[:len(xfsMagic)]) != xfsMagic {
			return NoFilesystem, false
		}
		if head[xfsInProgressOff] != 0 {
			return MkfsUnfinished, false
		}
		return MkfsFinished, false
	case "ext2", "ext3", "ext4":
		if len(head) < extSuperblock*2 || binary.LittleEndian.Uint16(head[extMagicOff:]) != extMagic {
			return NoFilesystem, false
		}
		// The kernel writes both at a read-write mount: whatever a pod
		// wrote is behind one.
		if binary.LittleEndian.Uint32(head[extMtimeOff:]) != 0 || binary.LittleEndian.Uint16(head[extMntOff:]) != 0 {
			return MkfsFinished, false
		}
		return NoFilesystem, true
	}
	return NoFilesystem, false
}

// readHead reads the first superblockHead bytes of device, past the page
// cache where the device allows it.
func (f *FS) readHead(device string) ([]byte, error) {
	if r, ok := f.exec.(HeadReader); ok {
		return r.ReadHead(device, superblockHead)
	}
	d, err := directio.Open(device, os.O_RDONLY, true)
	if err != nil {
		return nil, err
	}
	defer d.Close() //nolint:errcheck // read-only; nothing to flush
	buf, release, err := directio.Buffer(superblockHead)
	if err != nil {
		return nil, fmt.Errorf("the read buffer: %w", err)
	}
	defer release()
	n, err := d.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the superblock of %s: %w", device, err)
	}
	return append([]byte(nil), buf[:n]...), nil
}
