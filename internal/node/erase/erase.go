// Package erase zeroes block devices, whole or where signatures live, so a
// new volume never shows its extents' previous bytes or signatures.
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
	// ZeroOut is BLKZEROOUT (as blkdiscard --zeroout): WRITE ZEROES with
	// NOUNMAP where offered, else zero pages. A plain discard is never used:
	// only some devices read zeros after it.
	ZeroOut Method = "zeroout"
	// Write writes zeros from carve, for devices whose WRITE ZEROES is not
	// trusted.
	Write Method = "write"
	// None erases nothing.
	None Method = "none"
	// Signatures zeroes only the SignatureRegions, so NodeStage reads a new
	// thick filesystem volume as blank without blkid. Not a class method.
	Signatures Method = "signatures"
	// Flush only fsyncs: lvm2 writes metadata with O_DIRECT and no FLUSH, so a
	// power cut could undo a new, removed or grown LV after the call answered.
	// FlushAll flushes the PVs themselves. Not a class method.
	Flush Method = "flush"
)

// Methods are the valid methods, the default first.
var Methods = []Method{ZeroOut, Write, None}

// chunk bounds how long a stop waits: ctx is checked between chunks.
const chunk = 64 << 20

const writeBuffer = 1 << 20

// Device zeroes path with m and returns the bytes zeroed. O_EXCL refuses a
// mounted or exclusively opened device rather than overwrite it under a user.
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

type target interface {
	Name() string
	WriteAt(b []byte, off int64) (int, error)
	ZeroRange(off, length int64) error
	// Sync of a block device flushes its write cache.
	Sync() error
}

type blockFile struct{ *os.File }

func (f blockFile) ZeroRange(off, length int64) error { return zeroRange(f.File, off, length) }

// zeroOut syncs after BLKZEROOUT: a volatile write cache may still hold the
// zeroing, and a power cut could bring the previous tenant's bytes back.
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

// Where libblkid (blkid -p, lvcreate's wipe) looks for signatures. Head: up
// to LUKS2's last secondary header (4 KiB at 4 MiB). Tail: md 0.90/1.0, the
// GPT backup, ZFS, DRBD, bcachefs and firmware RAID, the farthest Promise
// FastTrack's 1.5 MiB from the end.
const (
	signatureHead = 4<<20 + 4<<10
	signatureTail = 2 << 20
	regionAlign   = 4096
)

// SignatureRegions returns the [start, end) byte ranges of a device of size
// bytes where a signature can live, or the whole of a smaller device.
func SignatureRegions(size int64) [][2]int64 {
	headEnd := min(size, signatureHead)
	tailStart := max(headEnd, (size-signatureTail)/regionAlign*regionAlign)
	regions := [][2]int64{{0, headEnd}}
	if tailStart < size {
		regions = append(regions, [2]int64{tailStart, size})
	}
	return regions
}

// signatures: lvcreate zeroes only a new LV's first 4 KiB and wipes what
// libblkid finds, leaving a removed volume's other bytes.
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
	if err := f.Sync(); err != nil {
		return n, fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	return n, nil
}

// flush fsyncs the device, which sends a FLUSH to every device under it. A
// read-only open suffices and needs no exclusivity.
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

// Eraser zeroes the device at path with m and returns the bytes zeroed; an
// error wrapping fs.ErrNotExist when the node does not exist.
type Eraser interface {
	Erase(ctx context.Context, path string, m Method) (int64, error)
}

// FlushAll flushes each device at paths and joins the failures: a VG's
// metadata change is durable once each PV is flushed.
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
