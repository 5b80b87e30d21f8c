package nodecopy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/carve-csi/carve/pkg/blockcopy"
)

// Digest is a copy's end-to-end checksum (CopyTrailer.sha256): the
// SHA-256 of the SHA-256 digests of the source's SparseChunk-byte chunks
// in order, the last chunk shorter when the size is not a multiple. It
// is as strong a check as a SHA-256 of the bytes, and cheaper: the
// digest of an all-zero chunk is computed once, not once per chunk, so a
// mostly empty volume costs little to check. Both ends compute it the
// same way; the chunks must be fed in order, each whole (Data and Zeros
// take any number of whole chunks, and a short one only at the end).
type Digest struct {
	h hash.Hash
	// n is how many bytes were fed.
	n uint64
}

// zeroChunk is the SHA-256 of a whole chunk of zeros.
var zeroChunk = sha256.Sum256(make([]byte, SparseChunk))

// NewDigest returns an empty Digest.
func NewDigest() *Digest { return &Digest{h: sha256.New()} }

// Data feeds the chunks of b, zero or not.
func (d *Digest) Data(b []byte) {
	for i := 0; i < len(b); i += SparseChunk {
		d.chunk(b[i:min(i+SparseChunk, len(b))])
	}
}

// Zeros feeds n bytes of zeros.
func (d *Digest) Zeros(n uint64) {
	d.n += n
	for ; n >= SparseChunk; n -= SparseChunk {
		d.h.Write(zeroChunk[:])
	}
	if n > 0 {
		sum := sha256.Sum256(zeros[:n])
		d.h.Write(sum[:])
	}
}

// chunk feeds one chunk (at most SparseChunk bytes) and tells whether it
// was all zeros: the sender's test of what to send, made in the same
// pass as the digest.
func (d *Digest) chunk(b []byte) (zero bool) {
	if isZero(b) {
		d.Zeros(uint64(len(b)))
		return true
	}
	sum := sha256.Sum256(b)
	d.h.Write(sum[:])
	d.n += uint64(len(b))
	return false
}

// isZero tells whether b (at most maxData bytes) is all zeros.
func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }

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
