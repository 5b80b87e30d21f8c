package peercopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash"
	"iter"
	"os"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/directio"
)

// Digest is a copy's end-to-end checksum: XXH64 of the XXH64 hashes of the
// source's SparseChunk chunks in order (nodeagent.proto). It guards against
// bugs, torn writes and reading back what was not written, not an attacker
// (TLS does), so XXH64, an eighth of SHA-256's CPU, serves.
type Digest struct {
	list hash.Hash
	sum  []byte
	n    uint64
}

func chunkHash(dst, b []byte) []byte { return binary.BigEndian.AppendUint64(dst, xxhash.Sum64(b)) }

var zeroChunkHash = chunkHash(nil, make([]byte, SparseChunk))

// NewDigest returns an empty Digest.
func NewDigest() *Digest {
	return &Digest{list: xxhash.New(), sum: make([]byte, 0, len(zeroChunkHash))}
}

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
		d.list.Write(zeroChunkHash)
	}
	if n > 0 {
		d.list.Write(chunkHash(d.sum[:0], zeros[:n]))
	}
}

// chunk feeds one chunk and tells whether it was all zeros: the sender's
// test of what to send, in the digest's pass.
func (d *Digest) chunk(b []byte) (zero bool) {
	if isZero(b) {
		d.Zeros(uint64(len(b)))
		return true
	}
	d.list.Write(chunkHash(d.sum[:0], b))
	d.n += uint64(len(b))
	return false
}

func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }

// At feeds an offset (DIGEST_SCOPE_SENT), so the same bytes at another
// place do not check.
func (d *Digest) At(off uint64) {
	d.list.Write(binary.BigEndian.AppendUint64(d.sum[:0], off))
}

// Size is how many bytes were fed.
func (d *Digest) Size() uint64 { return d.n }

// Sum is the digest of what was fed.
func (d *Digest) Sum() []byte { return d.list.Sum(nil) }

// DigestOf is the Digest of path's first size bytes, read as Send reads.
func DigestOf(ctx context.Context, path string, size uint64) ([]byte, error) {
	whole := func(yield func(changemap.Extent) bool) {
		for off := uint64(0); off < size; off += readSize {
			if !yield(changemap.Extent{Off: off, Len: min(readSize, size-off)}) {
				return
			}
		}
	}
	return digestRead(ctx, path, size, whole, readSize, false)
}

// DigestOfPlaces is the Digest of places of path as SendNamed digests them:
// one extent a message, in order, not merged.
func DigestOfPlaces(ctx context.Context, path string, size uint64, places []changemap.Extent) ([]byte, error) {
	return digestRead(ctx, path, size, slices.Values(places), maxData, true)
}

// digestRead digests path's extents in order, each at most most bytes and
// led by its offset when placed.
func digestRead(ctx context.Context, path string, size uint64, extents iter.Seq[changemap.Extent], most uint64, placed bool) ([]byte, error) {
	d := NewDigest()
	in, err := directio.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return nil, err
	}
	defer in.Close() //nolint:errcheck // read-only
	buf := directio.Aligned(int(most))
	for e := range extents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if e.Len > most {
			return nil, fmt.Errorf("a data message of %d bytes at %d, more than the %d a message holds", e.Len, e.Off, most)
		}
		if err := readFull(in, path, buf[:e.Len], e.Off); err != nil {
			return nil, err
		}
		if placed {
			d.At(e.Off)
		}
		d.Data(buf[:e.Len])
	}
	return d.Sum(), nil
}
