// Package blockcopy copies the bytes of one block device to another: the
// data of a restore or a clone into a thick volume. It writes every byte of
// the target, zeros included (the source's zeros, and zeros past the
// source's end), because the target's extents may hold an earlier volume's
// data, and it syncs the target before it reports the
// copy done. It does not resume: a copy that was cut short is redone from
// the start, which is always correct and, at device speed, rarely longer
// than finding where it stopped.
package blockcopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultBufferSize is the size of each read and write: large enough that
// per-call costs vanish against device time, small enough to stay out of
// the way of the plugin's memory limit.
const DefaultBufferSize = 4 << 20

// align is what O_DIRECT asks of offsets, lengths and buffers on every
// block device carve meets (logical blocks of 512 or 4096 bytes).
const align = 4096

// Options tune a copy; the zero value is a buffered copy of
// DefaultBufferSize chunks.
type Options struct {
	// BufferSize is the size of each read and write, a multiple of 4096;
	// 0 means DefaultBufferSize.
	BufferSize int
	// Direct opens both sides with O_DIRECT, so that a copy of a large
	// volume does not evict the node's page cache. Where the filesystem
	// refuses O_DIRECT (tmpfs, in tests) the copy falls back to buffered
	// I/O. Size must then be a multiple of 4096.
	Direct bool
	// Progress, when set, is called after each chunk with the bytes
	// copied so far.
	Progress func(copied uint64)
}

// Result is what a copy did.
type Result struct {
	// Bytes is how many bytes of the source were written to the target.
	Bytes uint64
	// Zeroed is how many bytes of the target past the copy were zeroed.
	Zeroed uint64
	// Duration is the time the copy took, the final sync included.
	Duration time.Duration
}

// ErrShortSource is a source that ended before size bytes.
var ErrShortSource = errors.New("source is shorter than the copy")

// Copy copies the first size bytes of src to the start of dst (both paths,
// both existing), zeroes the rest of dst, and syncs dst. The context is checked between chunks; an
// ended context stops the copy with its error, leaving dst partly
// written. Result.Bytes is set also when the copy fails.
func Copy(ctx context.Context, dst, src string, size uint64, opts Options) (Result, error) {
	start := time.Now()
	var res Result
	bufSize := opts.BufferSize
	if bufSize == 0 {
		bufSize = DefaultBufferSize
	}
	if bufSize <= 0 || bufSize%align != 0 {
		return res, fmt.Errorf("buffer size %d is not a positive multiple of %d", bufSize, align)
	}
	if opts.Direct && size%align != 0 {
		return res, fmt.Errorf("size %d is not a multiple of %d, which direct I/O needs", size, align)
	}
	in, err := open(src, os.O_RDONLY, opts.Direct)
	if err != nil {
		return res, err
	}
	defer in.Close() //nolint:errcheck // read-only; nothing to flush
	out, err := open(dst, os.O_WRONLY, opts.Direct)
	if err != nil {
		return res, err
	}
	defer out.Close() //nolint:errcheck // synced below before success is reported

	// An anonymous mapping is page-aligned, as O_DIRECT needs.
	buf, err := unix.Mmap(-1, 0, bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return res, fmt.Errorf("allocating a %d-byte copy buffer: %w", bufSize, err)
	}
	defer unix.Munmap(buf) //nolint:errcheck // unmapping our own mapping fails only on a bad address

	for res.Bytes < size {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("copying %s to %s stopped after %d of %d bytes: %w", src, dst, res.Bytes, size, err)
		}
		n := min(uint64(bufSize), size-res.Bytes)
		chunk := buf[:n]
		off := int64(res.Bytes)
		if _, err := in.ReadAt(chunk, off); err != nil {
			if errors.Is(err, io.EOF) {
				return res, fmt.Errorf("reading %s at %d: %w", src, off, ErrShortSource)
			}
			return res, fmt.Errorf("reading %s at %d: %w", src, off, err)
		}
		if _, err := out.WriteAt(chunk, off); err != nil {
			return res, fmt.Errorf("writing %s at %d: %w", dst, off, err)
		}
		res.Bytes += n
		if opts.Progress != nil {
			opts.Progress(res.Bytes)
		}
	}
	// A target bigger than the copy (a restore asked bigger than its
	// snapshot) may hold an earlier volume's data past it: zero the rest,
	// so that the new volume shows the source's bytes and zeros only.
	end, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return res, fmt.Errorf("size of %s: %w", dst, err)
	}
	clear(buf)
	for off := size; off < uint64(end); {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("zeroing %s past the copy stopped at %d of %d bytes: %w", dst, off, end, err)
		}
		n := min(uint64(bufSize), uint64(end)-off)
		if _, err := out.WriteAt(buf[:n], int64(off)); err != nil {
			return res, fmt.Errorf("zeroing %s at %d: %w", dst, off, err)
		}
		off += n
		res.Zeroed += n
	}
	if err := out.Sync(); err != nil {
		return res, fmt.Errorf("syncing %s after the copy: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return res, fmt.Errorf("closing %s after the copy: %w", dst, err)
	}
	res.Duration = time.Since(start)
	return res, nil
}

// open opens path with flag, with O_DIRECT when direct is set and the
// filesystem takes it.
func open(path string, flag int, direct bool) (*os.File, error) {
	if direct {
		f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0) //nolint:gosec // G304: device paths the driver built from LVM's report
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, flag, 0) //nolint:gosec // G304: device paths the driver built from LVM's report
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return f, nil
}

// Copier copies with fixed options; the driver holds one.
type Copier struct {
	Options Options
}

// Copy is Copy with the Copier's options; progress reports the bytes
// copied so far after each chunk (nil for none).
func (c Copier) Copy(ctx context.Context, dst, src string, size uint64, progress func(uint64)) (Result, error) {
	o := c.Options
	o.Progress = progress
	return Copy(ctx, dst, src, size, o)
}
