// Package blockcopy copies one block device to another: the data of a restore
// or clone that is not a thin snapshot. Into a thick volume it writes every
// byte, zeros included, as the extents may hold older data; into a new thin
// volume (Sparse) only the chunks with data, as dm-thin provisions a block
// for every zero written. It syncs before it reports the copy done, and does
// not resume: a cut copy is redone, at device speed rarely longer than
// finding where it stopped.
package blockcopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/carve-csi/carve/internal/node/directio"
)

// DefaultBufferSize is the size of each read and write: large enough that
// per-call costs vanish against device time, small enough to stay out of
// the way of the plugin's memory limit.
const DefaultBufferSize = 4 << 20

// align is what O_DIRECT asks of offsets, lengths and buffers.
const align = directio.Align

// Options tune a copy; the zero value is a buffered copy of
// DefaultBufferSize chunks.
type Options struct {
	// BufferSize is the size of each read and write, a multiple of 4096;
	// 0 means DefaultBufferSize.
	BufferSize int
	// Direct opens both sides with O_DIRECT, so that a large copy does not evict
	// the page cache. Where the filesystem refuses it (tmpfs in tests) or a size
	// is not a multiple of 4096 (LVM extents may be one sector), the copy is
	// buffered, and synced all the same.
	Direct bool
	// Sparse skips the source's all-zero chunks (SparseChunk, aligned) and leaves
	// the target past the copy as it is: only for a new thin volume, whose
	// unwritten blocks read as zeros. A chunk with data is written whole, so that
	// a pool block it provisions holds only the source's bytes.
	Sparse bool
	// Progress, when set, is called after each chunk with the bytes
	// copied so far.
	Progress func(copied uint64)
}

// SparseChunk is the unit a sparse copy skips: dm-thin's smallest (and
// LVM's default) pool chunk, so that a skipped chunk of a pool with
// 64 KiB chunks is never provisioned at all.
const SparseChunk = 64 << 10

// Result is what a copy did.
type Result struct {
	// Bytes is how many bytes of the source were copied: written to the
	// target, or (Sparse) found all zero and skipped.
	Bytes uint64
	// Skipped is how many of those were zeros not written (Sparse).
	Skipped uint64
	// Zeroed is how many bytes of the target past the copy were zeroed.
	Zeroed uint64
	// Duration is the time the copy took, the final sync included.
	Duration time.Duration
}

// ErrShortSource is a source that ended before size bytes.
var ErrShortSource = errors.New("source is shorter than the copy")

// Copy copies the first size bytes of src to the start of dst, zeroes the
// rest of dst (unless Sparse) and syncs dst. An ended context stops it
// between chunks, dst partly written; Result.Bytes is set on failure too.
func Copy(ctx context.Context, dst, src string, size uint64, opts Options) (Result, error) {
	start := time.Now()
	var res Result
	bufSize := opts.BufferSize
	if bufSize == 0 {
		bufSize = DefaultBufferSize
	}
	if bufSize <= 0 || bufSize%align != 0 || opts.Sparse && bufSize%SparseChunk != 0 {
		return res, fmt.Errorf("buffer size %d is not a positive multiple of %d (of %d for a sparse copy)", bufSize, align, SparseChunk)
	}
	direct := opts.Direct && size%align == 0
	out, err := directio.Open(dst, os.O_WRONLY, direct)
	if err != nil {
		return res, err
	}
	defer func() { _ = out.Close() }() // synced before success is reported
	end, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return res, fmt.Errorf("size of %s: %w", dst, err)
	}
	if direct && end%align != 0 {
		// Its tail could not be written with O_DIRECT.
		direct = false
		if err := out.Close(); err != nil {
			return res, fmt.Errorf("closing %s: %w", dst, err)
		}
		if out, err = directio.Open(dst, os.O_WRONLY, false); err != nil {
			return res, err
		}
	}
	in, err := directio.Open(src, os.O_RDONLY, direct)
	if err != nil {
		return res, err
	}
	defer in.Close() //nolint:errcheck // read-only; nothing to flush

	buf, release, err := directio.Buffer(bufSize)
	if err != nil {
		return res, fmt.Errorf("the copy buffer: %w", err)
	}
	defer release()

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
		skipped, err := write(out, chunk, off, opts.Sparse)
		if err != nil {
			return res, fmt.Errorf("writing %s: %w", dst, err)
		}
		res.Skipped += skipped
		res.Bytes += n
		if opts.Progress != nil {
			opts.Progress(res.Bytes)
		}
	}
	// A target bigger than the copy (a restore asked bigger than its
	// snapshot) may hold an earlier volume's data past it: zero the rest,
	// so that the new volume shows the source's bytes and zeros only. A
	// new thin target reads zeros there already.
	if opts.Sparse {
		return Finish(out, dst, start, res)
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
	return Finish(out, dst, start, res)
}

// Finish syncs and closes out, the target dst of a copy that began at
// start, and returns res with the copy's duration (internal/node/peercopy's copies
// across nodes end the same way).
func Finish(out *os.File, dst string, start time.Time, res Result) (Result, error) {
	if err := out.Sync(); err != nil {
		return res, fmt.Errorf("syncing %s after the copy: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return res, fmt.Errorf("closing %s after the copy: %w", dst, err)
	}
	res.Duration = time.Since(start)
	return res, nil
}

// zeros is what an all-zero chunk of a sparse copy is compared with.
var zeros [SparseChunk]byte

// write writes chunk at off; sparse, it writes only the runs of
// SparseChunk-aligned chunks that hold data and returns how many bytes it
// skipped. off is a multiple of SparseChunk (the buffer size is).
func write(out *os.File, chunk []byte, off int64, sparse bool) (skipped uint64, err error) {
	if !sparse {
		if _, err := out.WriteAt(chunk, off); err != nil {
			return 0, fmt.Errorf("at %d: %w", off, err)
		}
		return 0, nil
	}
	// run is the start of the pending run of chunks with data, -1 none.
	run := -1
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		if _, err := out.WriteAt(chunk[run:end], off+int64(run)); err != nil {
			return fmt.Errorf("at %d: %w", off+int64(run), err)
		}
		run = -1
		return nil
	}
	for i := 0; i < len(chunk); i += SparseChunk {
		part := chunk[i:min(i+SparseChunk, len(chunk))]
		if bytes.Equal(part, zeros[:len(part)]) {
			if err := flush(i); err != nil {
				return skipped, err
			}
			skipped += uint64(len(part))
			continue
		}
		if run < 0 {
			run = i
		}
	}
	return skipped, flush(len(chunk))
}

// Copier copies with fixed options; the driver holds one.
type Copier struct {
	Options Options
}

// Copy is Copy with the Copier's options, sparse or not as asked;
// progress reports the bytes copied so far after each chunk (nil for
// none).
func (c Copier) Copy(ctx context.Context, dst, src string, size uint64, sparse bool, progress func(uint64)) (Result, error) {
	o := c.Options
	o.Sparse = sparse
	o.Progress = progress
	return Copy(ctx, dst, src, size, o)
}
