// Package erase zeroes block devices, so that a new volume never shows the
// bytes of a volume that used the same extents before it, or only the
// regions where signatures live, so that a new volume reads as blank.
package erase

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Method is how a device is zeroed.
type Method string

const (
	// ZeroOut asks the kernel to zero the device (BLKZEROOUT, as `blkdiscard
	// --zeroout`): WRITE ZEROES with NOUNMAP where the device offers it, else
	// zero pages. A plain discard is never used: only some devices read zeros
	// after it.
	ZeroOut Method = "zeroout"
	// Write writes zeros from carve, block by block: for devices whose
	// WRITE ZEROES offload is not trusted.
	Write Method = "write"
	// None erases nothing.
	None Method = "none"
	// Signatures zeroes only the SignatureRegions of the device: what a
	// new thick filesystem volume gets, so that NodeStage reads it as
	// blank without running blkid. Not a method a device class can name
	// (it is not in Methods): it leaves the rest of the device as it was.
	Signatures Method = "signatures"
	// Flush only flushes the device's write cache (fsync): lvm2 writes metadata
	// with O_DIRECT and no FLUSH, so a new, removed or grown LV could be undone by
	// a power cut after the call answered. An LV's device reaches the PVs under
	// it; FlushAll flushes the PVs themselves. No device class can name it.
	Flush Method = "flush"
)

// Methods are the valid methods, the default first.
var Methods = []Method{ZeroOut, Write, None}

// chunk is how much one ioctl or one round of writes covers: the context
// is checked between chunks, so a stop waits for at most one chunk.
const chunk = 64 << 20

const writeBuffer = 1 << 20

// Device zeroes the whole device (or file) at path with method m and
// returns the number of bytes zeroed. It opens the device exclusively
// (O_EXCL), so a device that is mounted or open elsewhere in exclusive mode
// is refused rather than overwritten under a user. It stops between chunks
// when ctx ends, with ctx's error; whatever was zeroed stays zeroed.
func Device(ctx context.Context, path string, m Method) (int64, error) {
	if m == None {
		return 0, nil
	}
	switch m {
	case Signatures:
		return signatures(ctx, path)
	case Flush:
		return 0, flush(path)
	}
	if m != ZeroOut && m != Write {
		return 0, fmt.Errorf("erase method %q: must be one of %v", m, Methods)
	}
	// #nosec G304 -- path is the device node of an LV carve just made
	// (/dev/<vg>/<lv>, both names validated), never user input.
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening %s to erase it: %w", path, err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		_ = f.Close()
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	switch m {
	case ZeroOut:
		err = zeroOut(ctx, blockFile{f}, size)
	default:
		err = write(ctx, blockFile{f}, size)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", path, cerr)
	}
	if err != nil {
		return 0, err
	}
	return size, nil
}

// target is what an erase writes to: the opened device (blockFile), or a
// fake that records the order of the calls.
type target interface {
	Name() string
	WriteAt(b []byte, off int64) (int, error)
	// ZeroRange is one BLKZEROOUT.
	ZeroRange(off, length int64) error
	// Sync is fsync: of a block device, a FLUSH of its write cache.
	Sync() error
}

// blockFile is the target of an opened device or file.
type blockFile struct{ *os.File }

func (f blockFile) ZeroRange(off, length int64) error { return zeroRange(f.File, off, length) }

// zeroOut issues BLKZEROOUT chunk by chunk, then syncs: a device with a
// volatile write cache may still hold the acknowledged zeroing there, and a
// power cut could bring the previous tenant's bytes back.
func zeroOut(ctx context.Context, f target, size int64) error {
	for off := int64(0); off < size; off += chunk {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("erasing %s stopped at byte %d of %d: %w", f.Name(), off, size, err)
		}
		if err := f.ZeroRange(off, min(chunk, size-off)); err != nil {
			return fmt.Errorf("BLKZEROOUT of %s at byte %d: %w", f.Name(), off, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s after BLKZEROOUT: %w", f.Name(), err)
	}
	return nil
}

// write writes zeros chunk by chunk and syncs at the end, so that the
// zeros are on the device before the volume is handed out.
func write(ctx context.Context, f target, size int64) error {
	buf := make([]byte, writeBuffer)
	for off := int64(0); off < size; {
		if off%chunk == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("erasing %s stopped at byte %d of %d: %w", f.Name(), off, size, err)
			}
		}
		n, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off)
		if err != nil {
			return fmt.Errorf("writing zeros to %s at byte %d: %w", f.Name(), off, err)
		}
		off += int64(n)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	return nil
}

// The regions of a device where libblkid (blkid -p, lvcreate's wipe) looks for
// a signature. Head: everything up to LUKS2's last secondary header, 4 KiB at
// 4 MiB. Tail: md 0.90/1.0, the GPT backup, ZFS, DRBD, bcachefs and firmware
// RAID, the farthest Promise FastTrack's 1.5 MiB from the end.
const (
	signatureHead = 4<<20 + 4<<10
	signatureTail = 2 << 20
	// regionAlign keeps the tail's start on what O_DIRECT and BLKZEROOUT
	// ask of offsets.
	regionAlign = 4096
)

// SignatureRegions returns the byte ranges, [start, end), of a device of
// size bytes where a signature can live: the first 4 MiB and 4 KiB and
// the last 2 MiB (from a 4 KiB boundary), or the whole of a smaller
// device. Device's Signatures zeroes them; internal/node/fs reads them to tell a
// blank device without running blkid.
func SignatureRegions(size int64) [][2]int64 {
	headEnd := min(size, signatureHead)
	tailStart := max(headEnd, (size-signatureTail)/regionAlign*regionAlign)
	regions := [][2]int64{{0, headEnd}}
	if tailStart < size {
		regions = append(regions, [2]int64{tailStart, size})
	}
	return regions
}

// signatures is Device's Signatures: lvcreate zeroes only the first 4 KiB
// of a new LV and wipes the signatures its libblkid finds, leaving the
// rest of a removed volume's bytes in place. A block device is zeroed
// with BLKZEROOUT, a file by writing zeros.
func signatures(ctx context.Context, path string) (int64, error) {
	// #nosec G304 -- path is the device node of an LV carve just made.
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening %s to zero its signature regions: %w", path, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(int(f.Fd()), &st)
	var size int64
	if err == nil {
		size, err = f.Seek(0, io.SeekEnd)
	}
	if err != nil {
		_ = f.Close()
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	n, err := zeroSignatures(ctx, blockFile{f}, size, st.Mode&unix.S_IFMT == unix.S_IFBLK)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", path, cerr)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// zeroSignatures zeroes the SignatureRegions of f, a device of size
// bytes (a block device with BLKZEROOUT, a file by writing zeros), and
// syncs it.
func zeroSignatures(ctx context.Context, f target, size int64, block bool) (int64, error) {
	var n int64
	for _, r := range SignatureRegions(size) {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		var err error
		if block {
			err = f.ZeroRange(r[0], r[1]-r[0])
		} else {
			_, err = f.WriteAt(make([]byte, r[1]-r[0]), r[0])
		}
		if err != nil {
			return n, fmt.Errorf("zeroing %s at byte %d: %w", f.Name(), r[0], err)
		}
		n += r[1] - r[0]
	}
	// A block device too: its BLKZEROOUT carries no flush (see zeroOut).
	if err := f.Sync(); err != nil {
		return n, fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	return n, nil
}

// flush is Device's Flush: fsync of the device, which for a block device
// sends a FLUSH down to every device under it. It opens the device
// read-only: a flush writes nothing of its own, and needs no exclusivity.
func flush(path string) error {
	// #nosec G304 -- path is the device node of an LV carve just made.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s to flush it: %w", path, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("flushing %s: %w", path, err)
	}
	return nil
}

// zeroRange issues one BLKZEROOUT.
func zeroRange(f *os.File, off, length int64) error {
	r := [2]uint64{uint64(off), uint64(length)}
	// #nosec G103 -- BLKZEROOUT takes a pointer to {start, length}; r
	// lives until the call returns.
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r))); errno != 0 {
		return errno
	}
	return nil
}

// IsMethod tells whether s names a method.
func IsMethod(s string) bool {
	for _, m := range Methods {
		if string(m) == s {
			return true
		}
	}
	return false
}

// Eraser zeroes the device at path with method m and returns how many
// bytes it zeroed; an error wrapping fs.ErrNotExist when the device node
// does not exist. Devices is the real one; tests fake it.
type Eraser interface {
	Erase(ctx context.Context, path string, m Method) (int64, error)
}

// FlushAll flushes the write cache of each device at paths with e (the
// Flush method), all of them even when one fails, and returns the
// failures joined. A volume group's metadata change is durable once each
// of its PVs is flushed: lvm2 writes the metadata with O_DIRECT, which
// leaves it in the disks' write caches, and sends no FLUSH of its own.
func FlushAll(ctx context.Context, e Eraser, paths []string) error {
	var errs []error
	for _, p := range paths {
		if _, err := e.Erase(ctx, p, Flush); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Devices is the Eraser of real devices (Device).
type Devices struct{}

// Erase implements Eraser.
func (Devices) Erase(ctx context.Context, path string, m Method) (int64, error) {
	return Device(ctx, path, m)
}
