package nodecopy

// STAND-IN: s5-copyfast adds the real digest.go (a SHA-256 of per-chunk
// SHA-256 digests) with this same API; at the merge take theirs and drop
// this file. Until then this is the SHA-256 of the bytes that Send and
// Receive compute, so that a catch-up and a full copy check alike.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/carve-csi/carve/pkg/blockcopy"
)

// Digest is a copy's end-to-end checksum (CopyTrailer.sha256).
type Digest struct {
	h hash.Hash
	n uint64
}

// NewDigest returns an empty Digest.
func NewDigest() *Digest { return &Digest{h: sha256.New()} }

// Data feeds b.
func (d *Digest) Data(b []byte) {
	d.h.Write(b)
	d.n += uint64(len(b))
}

// Zeros feeds n bytes of zeros.
func (d *Digest) Zeros(n uint64) {
	for n > 0 {
		k := min(n, uint64(len(zeros)))
		d.Data(zeros[:k])
		n -= k
	}
}

// Size is how many bytes were fed.
func (d *Digest) Size() uint64 { return d.n }

// Sum is the digest of what was fed.
func (d *Digest) Sum() []byte { return d.h.Sum(nil) }

// DigestOf is the Digest of the first size bytes of the file or device
// at path, read as Send reads a source.
func DigestOf(ctx context.Context, path string, size uint64) ([]byte, error) {
	in, err := blockcopy.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return nil, err
	}
	defer in.Close() //nolint:errcheck // read-only
	d := NewDigest()
	buf := alignedBuffer(readSize)
	for off := uint64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := min(uint64(readSize), size-off)
		if _, err := in.ReadAt(buf[:n], int64(off)); err != nil {
			if errors.Is(err, io.EOF) {
				err = blockcopy.ErrShortSource
			}
			return nil, fmt.Errorf("reading %s at %d: %w", path, off, err)
		}
		d.Data(buf[:n])
		off += n
	}
	return d.Sum(), nil
}
