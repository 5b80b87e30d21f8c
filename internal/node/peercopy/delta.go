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

// A catch-up, a move's last step, sends only what changed since a base
// snapshot the target holds, once the workload stopped: the chunks
// device-mapper metadata names (SendChanged, SendNamed), or those that differ
// from the base (SendDelta). The target checks the trailer's Digest on read
// back, so a chunk missed or written after the read fails (DATA_LOSS). The
// volume is held open exclusively: it must not be in use.

// DeltaReader is *provision.Provisioner.
type DeltaReader interface {
	// DeltaSize: provision.ErrNotFound, or ErrRefused when the volume is open.
	DeltaSize(ctx context.Context, volumeID, baseID string) (uint64, error)
	// ReadDelta gives read the devices, size and named changes under the
	// volume's lock, refusing as DeltaSize does.
	ReadDelta(ctx context.Context, volumeID, baseID string, read func(provision.Delta) error) error
}

var _ DeltaReader = (*provision.Provisioner)(nil)

func (s *Server) sourceSize(ctx context.Context, g Grant) (uint64, error) {
	if g.Base == "" {
		return s.cfg.Reader.SourceSize(ctx, g.Source, g.Snapshot)
	}
	if s.cfg.Deltas == nil {
		return 0, status.Errorf(codes.Unimplemented, "node %s serves no catch-ups against a base snapshot", s.cfg.NodeName)
	}
	return s.cfg.Deltas.DeltaSize(ctx, g.Source, g.Base)
}

// readDelta serves a catch-up grant's ReadVolume; sentOK: the target checks
// a digest of the data sent.
func (s *Server) readDelta(ctx context.Context, g Grant, node string, sentOK bool, stream nodeagentv1.NodeCopy_ReadVolumeServer) error {
	log := klog.FromContext(ctx).WithValues("copy", g.ID, "source", g.Source, "base", g.Base, "targetNode", node)
	if s.cfg.Deltas == nil {
		return status.Errorf(codes.Unimplemented, "node %s serves no catch-ups against a base snapshot", s.cfg.NodeName)
	}
	var sent Sent
	var how []any
	err := s.cfg.Deltas.ReadDelta(ctx, g.Source, g.Base, func(d provision.Delta) error {
		var err error
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

// ErrInUse: the catch-up's exclusive open failed (mounted or held).
var ErrInUse = errors.New("the volume is in use")

// SendDelta streams vol against base: the chunks where vol differs, then the
// Digest of all of vol. O_EXCL makes a mount fail while vol is read.
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

// SendChanged streams the chunks holding a byte of changed (zeros too: a
// discarded block must become zeros) and the Digest of all of vol.
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

// SendNamed streams only the chunks of changed, with a digest of the data
// sent: changed comes from the base snapshot's metadata, and the seed was
// checked whole.
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

type pair struct {
	now, was []byte
	off      uint64
}

// readPairs reads volume and base in readSize blocks into buffers the caller
// hands back on free; when full closes, errc holds the reader's error.
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

func sendChanged(s Sender, now, was []byte, off uint64, out *Sent) error {
	return sendRuns(s, now, off, out, func(i, end int) bool { return bytes.Equal(now[i:end], was[i:end]) })
}
