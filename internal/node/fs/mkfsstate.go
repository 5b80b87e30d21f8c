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

// MkfsState is what ProbeMkfs finds.
type MkfsState int

const (
	// NoFilesystem: no superblock of the type.
	NoFilesystem MkfsState = iota
	// MkfsUnfinished: an xfs flagged sb_inprogress, or a never-mounted ext2/3/4
	// that does not check clean. It holds nobody's data.
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

// superblockHead covers xfs's superblock at 0 and ext4's at 1024.
const superblockHead = 4096

// Superblock fields (xfs_format.h xfs_dsb; ext4.h ext4_super_block at 1024).
const (
	xfsMagic         = "XFSB"
	xfsInProgressOff = 126 // sb_inprogress: set by mkfs.xfs until it ends

	extSuperblock = 1024
	extMagicOff   = extSuperblock + 56 // s_magic
	extMagic      = 0xEF53
	extMtimeOff   = extSuperblock + 44 // s_mtime: the last mount
	extMntOff     = extSuperblock + 52 // s_mnt_count: mounts since the last check
)

// HeadReader reads a device's first n bytes (fstest's fake).
type HeadReader interface {
	ReadHead(device string, n int) ([]byte, error)
}

// ProbeMkfs tells whether a stage's mkfs ended, from the superblock (and
// e2fsck -n -f for a never-mounted ext). Only MkfsUnfinished may be zeroed.
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

// mkfsStateOf reads fsType's superblock in head; check: e2fsck decides.
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
		// The kernel writes both at a read-write mount: a pod's data may be behind.
		if binary.LittleEndian.Uint32(head[extMtimeOff:]) != 0 || binary.LittleEndian.Uint16(head[extMntOff:]) != 0 {
			return MkfsFinished, false
		}
		return NoFilesystem, true
	}
	return NoFilesystem, false
}

// readHead reads past the page cache where the device allows.
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
