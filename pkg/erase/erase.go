// Package erase zeroes block devices, so that a new volume never shows the
// bytes of a volume that used the same extents before it.
package erase

import (
	"context"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Method is how a device is zeroed.
type Method string

const (
	// ZeroOut asks the kernel to zero the device (BLKZEROOUT, what
	// `blkdiscard --zeroout` does): the kernel sends WRITE ZEROES, which a
	// device that guarantees zeroes afterwards may serve by unmapping
	// (discarding) the blocks, and writes zero pages itself where the
	// device offers no such guarantee. A plain discard is never used,
	// because only some devices read zeros after it.
	ZeroOut Method = "zeroout"
	// Write writes zeros from carve, block by block: for devices whose
	// WRITE ZEROES offload is not trusted.
	Write Method = "write"
	// None erases nothing.
	None Method = "none"
)

// Methods are the valid methods, the default first.
var Methods = []Method{ZeroOut, Write, None}

// chunk is how much one ioctl or one round of writes covers: the context
// is checked between chunks, so a stop waits for at most one chunk.
const chunk = 64 << 20

// writeBuffer is the size of one write of the Write method.
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
		err = zeroOut(ctx, f, size)
	default:
		err = write(ctx, f, size)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", path, cerr)
	}
	if err != nil {
		return 0, err
	}
	return size, nil
}

// zeroOut issues BLKZEROOUT chunk by chunk. The ioctl returns once the
// range reads as zeros, so no sync is needed after it.
func zeroOut(ctx context.Context, f *os.File, size int64) error {
	for off := int64(0); off < size; off += chunk {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("erasing %s stopped at byte %d of %d: %w", f.Name(), off, size, err)
		}
		r := [2]uint64{uint64(off), uint64(min(chunk, size-off))}
		// #nosec G103 -- BLKZEROOUT takes a pointer to {start, length};
		// r lives until the call returns.
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r))); errno != 0 {
			return fmt.Errorf("BLKZEROOUT of %s at byte %d: %w", f.Name(), off, errno)
		}
	}
	return nil
}

// write writes zeros chunk by chunk and syncs at the end, so that the
// zeros are on the device before the volume is handed out.
func write(ctx context.Context, f *os.File, size int64) error {
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

// IsMethod tells whether s names a method.
func IsMethod(s string) bool {
	for _, m := range Methods {
		if string(m) == s {
			return true
		}
	}
	return false
}
