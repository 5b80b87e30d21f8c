package peercopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
)

// A catch-up, the last step of a move, sends only what changed since a base
// snapshot the target holds already, once the workload stopped. The source
// reads the volume once and sends the chunks its device-mapper metadata names
// (SendChanged, SendNamed), or reads the base too and sends the chunks that
// differ (SendDelta). The trailer's Digest is checked against the target read
// back, so a chunk missed or written after the read fails it (DATA_LOSS).
// The volume is read as it is, held open exclusively: it must not be in use.

// DeltaReader reads a volume of this node against a snapshot of it, for
// a catch-up; *provision.Provisioner is one.
type DeltaReader interface {
	// DeltaSize is the size of volume volumeID for a catch-up against its
	// snapshot baseID: provision.ErrNotFound when either is not here or
	// baseID is not a snapshot of volumeID, provision.ErrRefused when the
	// volume is open (in use).
	DeltaSize(ctx context.Context, volumeID, baseID string) (uint64, error)
	// ReadDelta gives read the device nodes of volumeID and of baseID,
	// the volume's size and its changes since the base when metadata
	// names them, under the volume's lock, with the same refusals as
	// DeltaSize (checked again now), and fails the read when the volume
	// was opened meanwhile.
	ReadDelta(ctx context.Context, volumeID, baseID string, read func(provision.Delta) error) error
}

var _ DeltaReader = (*provision.Provisioner)(nil)

// sourceSize is the size of a grant's source, checked readable.
func (s *Server) sourceSize(ctx context.Context, g Grant) (uint64, error) {
	if g.Base == "" {
		return s.cfg.Reader.SourceSize(ctx, g.Source, g.Snapshot)
	}
	if s.cfg.Deltas == nil {
		return 0, status.Errorf(codes.Unimplemented, "node %s serves no catch-ups against a base snapshot", s.cfg.NodeName)
	}
	return s.cfg.Deltas.DeltaSize(ctx, g.Source, g.Base)
}

// readDelta serves the ReadVolume of a catch-up grant.
// sentOK: the target checks a digest of the data sent (DIGEST_SCOPE_SENT).
func (s *Server) readDelta(ctx context.Context, g Grant, node string, sentOK bool, stream nodeagentv1.NodeCopy_ReadVolumeServer) error {
	log := klog.FromContext(ctx).WithValues("copy", g.ID, "source", g.Source, "base", g.Base, "targetNode", node)
	if s.cfg.Deltas == nil {
		return status.Errorf(codes.Unimplemented, "node %s serves no catch-ups against a base snapshot", s.cfg.NodeName)
	}
	var sent Sent
	var how []any
	err := s.cfg.Deltas.ReadDelta(ctx, g.Source, g.Base, func(d provision.Delta) error {
		var err error
		// readBytes: what the source reads of its devices.
		if d.Method == provision.DeltaCompare {
			how = []any{"method", d.Method, "fallback", d.Fallback, "readBytes", 2 * d.Size, "baseReadBytes", d.Size}
			sent, err = SendDelta(ctx, d.Volume, d.Base, d.Size, stream)
			return err
		}
		if !sentOK {
			how = []any{"method", d.Method, "namedBytes", d.Changed.Bytes(), "readBytes", d.Size, "baseReadBytes", 0, "digestScope", "volume"}
			sent, err = SendChanged(ctx, d.Volume, d.Size, d.Changed, stream)
			return err
		}
		sent, err = SendNamed(ctx, d.Volume, d.Size, d.Changed, stream)
		how = []any{"method", d.Method, "namedBytes", d.Changed.Bytes(), "readBytes", sent.Data, "baseReadBytes", 0, "digestScope", "sent"}
		return err
	})
	if err != nil {
		log.Error(err, "A catch-up to another node failed", append([]any{"sentBytes", sent.Data}, how...)...)
		return nodestatus.OfRead(err, "catch-up "+g.ID)
	}
	log.Info("Sent a catch-up to another node", append([]any{"dataBytes", sent.Data, "duration", sent.Duration}, how...)...)
	return nil
}

// ErrInUse: the volume of a catch-up is open elsewhere (its exclusive
// open failed: it is mounted, or held exclusively).
var ErrInUse = errors.New("the volume is in use")

// SendDelta streams the first size bytes of the device vol against the
// device base: a header that says it is a delta, the runs of
// SparseChunk-aligned chunks where vol differs from base (at most
// maxData bytes a message), and the trailer with the Digest of vol's
// size bytes. vol is opened exclusively (O_EXCL: a mount of it fails
// while it is read; one that is mounted fails the open, ErrInUse). The
// next pair of blocks is read while one is sent.
func SendDelta(ctx context.Context, vol, base string, size uint64, s Sender) (Sent, error) {
	start := time.Now()
	var out Sent
	d := NewDigest()
	direct := size%4096 == 0
	in, err := openDeltaSource(vol, size, nodeagentv1.DigestScope_DIGEST_SCOPE_VOLUME, s)
	if err != nil {
		return out, err
	}
	defer in.Close() //nolint:errcheck // read-only
	old, err := directio.Open(base, os.O_RDONLY, direct)
	if err != nil {
		return out, err
	}
	defer old.Close() //nolint:errcheck // read-only
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	full, free, errc := readPairs(ctx, in, old, vol, base, size)
	for p := range full {
		d.Data(p.now)
		err := sendChanged(s, p.now, p.was, p.off, &out)
		free <- p
		if err != nil {
			return out, err
		}
	}
	return sendTrailer(s, d, out, start, errc)
}

// SendChanged streams the first size bytes of the device vol as a
// catch-up whose changes since the base are named: the header of a
// delta, the runs of SparseChunk-aligned chunks that hold a byte of
// changed (at most maxData bytes a message; a chunk of zeros too, as
// a block discarded since the base must become zeros on the target),
// and the trailer with the Digest of vol's size bytes, all read: the
// base is not. vol is opened exclusively as by SendDelta.
func SendChanged(ctx context.Context, vol string, size uint64, changed changemap.Set, s Sender) (Sent, error) {
	start := time.Now()
	d := NewDigest()
	in, err := openDeltaSource(vol, size, nodeagentv1.DigestScope_DIGEST_SCOPE_VOLUME, s)
	if err != nil {
		return Sent{}, err
	}
	defer in.Close() //nolint:errcheck // read-only
	return sendRead(ctx, in, vol, size, s, d, start, func(off uint64, chunk []byte) bool {
		d.Data(chunk)
		return !changed.Overlaps(off, off+uint64(len(chunk)))
	})
}

// SendNamed streams a catch-up reading only the changes named: a delta header
// whose digest covers the data sent (DIGEST_SCOPE_SENT), the SparseChunk
// chunks holding a byte of changed (zeros too: a block discarded since the
// base must become zeros), and the trailer. Neither the rest of vol nor the
// base is read: changed comes from the base snapshot's own metadata, and the
// seed copy was checked whole. vol is opened exclusively.
func SendNamed(ctx context.Context, vol string, size uint64, changed changemap.Set, s Sender) (Sent, error) {
	start := time.Now()
	var out Sent
	d := NewDigest()
	in, err := openDeltaSource(vol, size, nodeagentv1.DigestScope_DIGEST_SCOPE_SENT, s)
	if err != nil {
		return out, err
	}
	defer in.Close() //nolint:errcheck // read-only
	buf := directio.Aligned(maxData)
	for _, e := range chunksOf(changed, size) {
		for off, end := e.Off, e.Off+e.Len; off < end; {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			n := min(uint64(maxData), end-off)
			if err := readFull(in, vol, buf[:n], off); err != nil {
				return out, err
			}
			d.At(off)
			d.Data(buf[:n])
			if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{
				Data: &nodeagentv1.CopyData{Offset: int64(off), Data: buf[:n]}}}); err != nil {
				return out, fmt.Errorf("sending %d bytes at %d: %w", n, off, err)
			}
			out.Data += n
			off += n
		}
	}
	read := make(chan error, 1)
	read <- nil // by this goroutine, all of it
	return sendTrailer(s, d, out, start, read)
}

// chunksOf is changed widened to whole SparseChunk chunks, within size:
// the places a catch-up sends, in order.
func chunksOf(changed changemap.Set, size uint64) changemap.Set {
	var out changemap.Set
	for _, e := range changed {
		off := e.Off / SparseChunk * SparseChunk
		end := min(size, (e.Off+e.Len+SparseChunk-1)/SparseChunk*SparseChunk)
		if off < end {
			out = out.Add(off, end-off)
		}
	}
	return out
}

// openDeltaSource opens vol exclusively (a mounted one fails, ErrInUse) and
// sends the header of a delta of size bytes.
func openDeltaSource(vol string, size uint64, scope nodeagentv1.DigestScope, s Sender) (*os.File, error) {
	in, err := directio.Open(vol, os.O_RDONLY|unix.O_EXCL, size%4096 == 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, provision.Errorf(provision.ErrRefused, "%v: %s (mounted or held by another program); a catch-up reads only a volume nothing uses", ErrInUse, vol)
	}
	if err != nil {
		return nil, err
	}
	if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{
		Header: &nodeagentv1.CopyHeader{SizeBytes: int64(size), ChunkBytes: SparseChunk, Delta: true, DigestScope: scope}}}); err != nil {
		_ = in.Close()
		return nil, fmt.Errorf("sending the header: %w", err)
	}
	return in, nil
}

// pair is one block of the volume (now) and of its base (was).
type pair struct {
	now, was []byte
	off      uint64
}

// readPairs reads the volume and the base in readSize blocks, both of a
// block at once, into two pairs of buffers that the caller hands back
// on free. full is closed at the end; errc then holds the reader's error
// (nil when all was read).
func readPairs(ctx context.Context, in, old *os.File, vol, base string, size uint64) (<-chan pair, chan<- pair, <-chan error) {
	full := make(chan pair, 1)
	free := make(chan pair, 2)
	errc := make(chan error, 1)
	for range 2 {
		free <- pair{now: directio.Aligned(readSize), was: directio.Aligned(readSize)}
	}
	go func() {
		defer close(full)
		errc <- func() error {
			for off := uint64(0); off < size; {
				var p pair
				select {
				case p = <-free:
				case <-ctx.Done():
					return ctx.Err()
				}
				n := min(uint64(readSize), size-off)
				p.now, p.was, p.off = p.now[:n], p.was[:n], off
				baseErr := make(chan error, 1)
				go func() { baseErr <- readFull(old, base, p.was, off) }()
				err := readFull(in, vol, p.now, off)
				if berr := <-baseErr; err == nil {
					err = berr
				}
				if err != nil {
					return err
				}
				select {
				case full <- p:
				case <-ctx.Done():
					return ctx.Err()
				}
				off += n
			}
			return nil
		}()
	}()
	return full, free, errc
}

func readFull(f *os.File, path string, b []byte, off uint64) error {
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = blockcopy.ErrShortSource
		}
		return fmt.Errorf("reading %s at %d: %w", path, off, err)
	}
	return nil
}

// sendChanged sends the chunks of now (at off) that differ from was, in
// runs of at most maxData bytes.
func sendChanged(s Sender, now, was []byte, off uint64, out *Sent) error {
	return sendRuns(s, now, off, out, func(i, end int) bool { return bytes.Equal(now[i:end], was[i:end]) })
}
