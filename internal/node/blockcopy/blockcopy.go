// Package blockcopy copies one block device to another: a restore or clone
// that is not a thin snapshot. Into a thick volume it writes every byte, as
// the extents may hold older data; into a new thin volume (Sparse) only
// chunks with data, as dm-thin provisions a block for every zero written. It
// syncs before reporting done and does not resume: a cut copy is redone.
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

// DefaultBufferSize makes per-call costs vanish against device time while
// staying clear of the plugin's memory limit.
const DefaultBufferSize = 4 << 20

const align = directio.Align

// Options tune a copy; the zero value is buffered, DefaultBufferSize chunks.
type Options struct {
	// BufferSize is a multiple of 4096; 0 means DefaultBufferSize.
	BufferSize int
	// Direct uses O_DIRECT so a large copy does not evict the page cache; where
	// refused, or for sizes not a multiple of 4096, the copy is buffered.
	Direct bool
	// Sparse skips the source's all-zero chunks and leaves the target past the
	// copy as it is: only for a new thin volume. A chunk with data is written
	// whole, so a pool block it provisions holds only the source's bytes.
	Sparse bool
	// Progress gets the bytes copied after each chunk.
	Progress func(copied uint64)
}

// SparseChunk is dm-thin's smallest (and LVM's default) pool chunk, so a
// skipped chunk of a 64 KiB-chunk pool is never provisioned.
const SparseChunk = 64 << 10

// Result is what a copy did.
type Result struct {
	// Bytes of the source were copied: written, or (Sparse) skipped as zeros.
	Bytes   uint64
	Skipped uint64
	Zeroed  uint64
	// Duration includes the final sync.
	Duration time.Duration
}

// ErrShortSource is a source that ended before size bytes.
var ErrShortSource = errors.New("source is shorter than the copy")

// Copy copies size bytes of src to dst, zeroes the rest (unless Sparse) and
// syncs. An ended ctx stops it between chunks.
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
	// A target bigger than the copy may hold an earlier volume's data past it:
	// zero it. A new thin target reads zeros there already.
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

// Finish syncs and closes the copy's target and sets its duration
// (peercopy's copies end the same way).
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

var zeros [SparseChunk]byte

// write writes chunk at off; sparse, only the chunks that hold data, and
// returns the bytes skipped. off is a multiple of SparseChunk.
func write(out *os.File, chunk []byte, off int64, sparse bool) (skipped uint64, err error) {
	if !sparse {
		if _, err := out.WriteAt(chunk, off); err != nil {
			return 0, fmt.Errorf("at %d: %w", off, err)
		}
		return 0, nil
	}
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

// Copy is Copy with the Copier's options; progress may be nil.
func (c Copier) Copy(ctx context.Context, dst, src string, size uint64, sparse bool, progress func(uint64)) (Result, error) {
	o := c.Options
	o.Sparse = sparse
	o.Progress = progress
	return Copy(ctx, dst, src, size, o)
}
