package peercopy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/changemap"
)

// Digest is a copy's end-to-end checksum (CopyTrailer.digest): a hash of
// the list of the hashes of the source's SparseChunk-byte chunks in
// order, the last chunk shorter when the size is not a multiple, made
// as a ChunkDigest says (nodeagent.proto). The hash of an all-zero chunk
// is computed once, not once per chunk, so a mostly empty volume costs
// little to check. Both ends compute it the same way; the chunks must be
// fed in order, each whole (Data and Zeros take any number of whole
// chunks, and a short one only at the end).
//
// The check guards against bugs, torn writes and reading back what was
// not written, not against an attacker: TLS authenticates the bytes in
// flight. So a copy asks for XXH64 (DefaultDigest), an eighth of
// SHA-256's CPU time; SHA-256 stays for agents older than ChunkDigest.
type Digest struct {
	kind nodeagentv1.ChunkDigest
	alg  *algorithm
	list hash.Hash
	// sum is room for one chunk's hash.
	sum []byte
	// n is how many bytes were fed.
	n uint64
}

// DefaultDigest is the digest a target asks of the source.
const DefaultDigest = nodeagentv1.ChunkDigest_CHUNK_DIGEST_XXH64

// algorithm is how one ChunkDigest hashes a chunk and the list.
type algorithm struct {
	// chunk appends the hash of b to dst.
	chunk func(dst, b []byte) []byte
	// list is a new hash of the list of chunk hashes.
	list func() hash.Hash
	// zero is the hash of a whole chunk of zeros.
	zero []byte
}

// algorithms are the digests this agent computes; never written to
// after init.
var algorithms = map[nodeagentv1.ChunkDigest]*algorithm{
	nodeagentv1.ChunkDigest_CHUNK_DIGEST_SHA256: withZero(&algorithm{
		chunk: func(dst, b []byte) []byte { s := sha256.Sum256(b); return append(dst, s[:]...) },
		list:  sha256.New,
	}),
	nodeagentv1.ChunkDigest_CHUNK_DIGEST_XXH64: withZero(&algorithm{
		chunk: func(dst, b []byte) []byte { return binary.BigEndian.AppendUint64(dst, xxhash.Sum64(b)) },
		list:  func() hash.Hash { return xxhash.New() },
	}),
}

func withZero(a *algorithm) *algorithm {
	a.zero = a.chunk(nil, make([]byte, SparseChunk))
	return a
}

// ErrDigest: a ChunkDigest this agent does not compute.
var ErrDigest = errors.New("unknown digest")

// NewDigest returns an empty Digest of alg, or ErrDigest naming the ones
// this agent computes.
func NewDigest(alg nodeagentv1.ChunkDigest) (*Digest, error) {
	a, ok := algorithms[alg]
	if !ok {
		return nil, fmt.Errorf("%w %v: this agent computes %s", ErrDigest, alg, knownDigests())
	}
	return &Digest{kind: alg, alg: a, list: a.list(), sum: make([]byte, 0, len(a.zero))}, nil
}

// knownDigests names the algorithms, for messages.
func knownDigests() string {
	names := make([]string, 0, len(algorithms))
	for alg := range algorithms {
		names = append(names, alg.String())
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
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
		d.list.Write(d.alg.zero)
	}
	if n > 0 {
		d.list.Write(d.alg.chunk(d.sum[:0], zeros[:n]))
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
	d.list.Write(d.alg.chunk(d.sum[:0], b))
	d.n += uint64(len(b))
	return false
}

// isZero tells whether b (at most maxData bytes) is all zeros.
func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }

// At feeds an offset: in a digest of the data sent (DIGEST_SCOPE_SENT),
// each message's offset before its chunks, so that the same bytes at
// another place do not check.
func (d *Digest) At(off uint64) {
	d.list.Write(binary.BigEndian.AppendUint64(d.sum[:0], off))
}

// Size is how many bytes were fed.
func (d *Digest) Size() uint64 { return d.n }

// Sum is the digest of what was fed.
func (d *Digest) Sum() []byte { return d.list.Sum(nil) }

// DigestOf is the Digest (of alg) of the first size bytes of the file
// or device at path, read as Send reads a source.
func DigestOf(ctx context.Context, path string, size uint64, alg nodeagentv1.ChunkDigest) ([]byte, error) {
	d, err := NewDigest(alg)
	if err != nil {
		return nil, err
	}
	in, err := blockcopy.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return nil, err
	}
	defer in.Close() //nolint:errcheck // read-only
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

// DigestOfPlaces is the Digest (of alg) of the places of the file or
// device at path (within size), each its offset and then its chunks, as
// SendNamed digests its data messages: places holds one extent a
// message, in order, as they came (not merged).
func DigestOfPlaces(ctx context.Context, path string, size uint64, places []changemap.Extent, alg nodeagentv1.ChunkDigest) ([]byte, error) {
	d, err := NewDigest(alg)
	if err != nil {
		return nil, err
	}
	in, err := blockcopy.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return nil, err
	}
	defer in.Close() //nolint:errcheck // read-only
	buf := alignedBuffer(maxData)
	for _, e := range places {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if e.Len > maxData {
			return nil, fmt.Errorf("a data message of %d bytes at %d, more than the %d a message holds", e.Len, e.Off, maxData)
		}
		if err := readFull(in, path, buf[:e.Len], e.Off); err != nil {
			return nil, err
		}
		d.At(e.Off)
		d.Data(buf[:e.Len])
	}
	return d.Sum(), nil
}
