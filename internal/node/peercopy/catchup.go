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

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/volume"
)

// The target's side of a catch-up (delta.go).

var _ provision.DeltaPuller = Puller{}

// PullDelta implements provision.DeltaPuller: it reads catch-up src.CopyID
// from src.Address, accepting only src.Node's certificate, into dst.
func (p Puller) PullDelta(ctx context.Context, src provision.RemoteSource, dst string, sentOK bool, progress func(uint64)) (provision.DeltaResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var res provision.DeltaResult
	err := p.read(ctx, src, sentOK, func(stream Receiver) error {
		var err error
		res, err = ReceiveDelta(ctx, dst, src.Size, sentOK, stream, progress)
		if err != nil {
			return fmt.Errorf("catch-up %s from node %s: %w", src.CopyID, src.Node, err)
		}
		return nil
	})
	return res, err
}

// ReceiveDelta writes a catch-up stream into path, which holds the base. It
// syncs, then reads back what the Digest covers (ErrChecksum): all of want,
// or only the places sent when sentOK.
func ReceiveDelta(ctx context.Context, path string, want uint64, sentOK bool, r Receiver, progress func(uint64)) (provision.DeltaResult, error) {
	start := time.Now()
	var res provision.DeltaResult
	first, err := r.Recv()
	if err != nil {
		return res, fmt.Errorf("receiving the header: %w", err)
	}
	hdr := first.GetHeader()
	switch {
	case hdr == nil:
		return res, errors.New("the stream does not start with a header")
	case !hdr.GetDelta():
		return res, errors.New("the source sent a whole copy, not a catch-up against the base; nothing was written")
	case uint64(hdr.GetSizeBytes()) != want:
		return res, fmt.Errorf("the source holds %d bytes, not the %d granted", hdr.GetSizeBytes(), want)
	}
	if err := checkChunks(hdr); err != nil {
		return res, err
	}
	scope := hdr.GetDigestScope()
	if _, ok := nodeagentv1.DigestScope_name[int32(scope)]; !ok {
		return res, fmt.Errorf("the source's checksum covers %v (CopyHeader.digest_scope), this agent checks DIGEST_SCOPE_VOLUME or DIGEST_SCOPE_SENT; nothing was written", scope)
	}
	if scope == nodeagentv1.DigestScope_DIGEST_SCOPE_SENT && !sentOK {
		return res, errors.New("the source's checksum covers only the data it sends (DIGEST_SCOPE_SENT), and this target asked for one of the whole volume; nothing was written")
	}
	out, err := os.OpenFile(path, os.O_WRONLY|unix.O_EXCL, 0) //nolint:gosec // G304: the device node of an LV provision found
	if errors.Is(err, unix.EBUSY) {
		return res, provision.Errorf(provision.ErrRefused, "%v: %s (mounted or held by another program); a catch-up writes only into a volume nothing uses", ErrInUse, path)
	}
	if err != nil {
		return res, fmt.Errorf("opening %s: %w", path, err)
	}
	defer func() { _ = out.Close() }() // synced before success is reported
	var sent changemap.Set
	trailer, err := writeDelta(ctx, out, path, want, r, &res, &sent, progress)
	if err != nil {
		return res, err
	}
	if err := out.Sync(); err != nil {
		return res, fmt.Errorf("syncing %s after the catch-up: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return res, fmt.Errorf("closing %s after the catch-up: %w", path, err)
	}
	var sum []byte
	if scope == nodeagentv1.DigestScope_DIGEST_SCOPE_SENT {
		sum, err = DigestOfPlaces(ctx, path, want, sent)
	} else {
		sum, err = DigestOf(ctx, path, want)
	}
	if err != nil {
		return res, fmt.Errorf("reading back %s: %w", path, err)
	}
	if !bytes.Equal(sum, trailer.GetDigest()) {
		return res, fmt.Errorf("%w: the volume after the catch-up has digest %x, the source %x (did the volume hold the base's data before? its seed copy may be unfinished)",
			ErrChecksum, sum, trailer.GetDigest())
	}
	res.Sum = sum
	res.Duration = time.Since(start)
	return res, nil
}

// writeDelta writes data messages at their increasing offsets within want,
// records each as an extent of sent, and returns the checked trailer.
func writeDelta(ctx context.Context, out *os.File, path string, want uint64, r Receiver, res *provision.DeltaResult, sent *changemap.Set, progress func(uint64)) (*nodeagentv1.CopyTrailer, error) {
	var next uint64
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("the catch-up stopped: %w", err)
		}
		m, err := r.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the stream ended without its trailer")
		}
		if err != nil {
			return nil, fmt.Errorf("receiving (%d bytes of data written): %w", res.Received, err)
		}
		if t := m.GetTrailer(); t != nil {
			if uint64(t.GetDataBytes()) != res.Received {
				return nil, fmt.Errorf("%w: got %d bytes of data, the source sent %d", ErrChecksum, res.Received, t.GetDataBytes())
			}
			return t, nil
		}
		d := m.GetData()
		if d == nil {
			return nil, errors.New("a stream message after the header that is neither data nor the trailer")
		}
		off, n := uint64(d.GetOffset()), uint64(len(d.GetData()))
		if d.GetOffset() < 0 || off < next || off+n > want || n == 0 {
			return nil, fmt.Errorf("data at %d (%d bytes) is out of order or past the source's %d bytes (at %d now)", d.GetOffset(), n, want, next)
		}
		if _, err := out.WriteAt(d.GetData(), int64(off)); err != nil {
			return nil, fmt.Errorf("writing %s at %d: %w", path, off, err)
		}
		next = off + n
		*sent = append(*sent, changemap.Extent{Off: off, Len: n})
		res.Received += n
		if progress != nil {
			progress(res.Received)
		}
	}
}

// CatchUpTarget is *provision.Provisioner.
type CatchUpTarget interface {
	CatchUp(ctx context.Context, r provision.CatchUpRequest) (provision.DeltaResult, error)
}

var _ CatchUpTarget = (*provision.Provisioner)(nil)

// CatchUps serves NodeAgent.CatchUpCopy on the target's node.
type CatchUps struct {
	Target CatchUpTarget
}

// CatchUpCopy answers with the codes nodeagent.proto documents.
func (c CatchUps) CatchUpCopy(ctx context.Context, req *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error) {
	for _, f := range []struct{ name, v string }{
		{"target_volume_id", req.GetTargetVolumeId()}, {"copy_id", req.GetCopyId()}, {"source_node", req.GetSourceNode()},
		{"source_address", req.GetSourceAddress()}, {"source_volume_id", req.GetSourceVolumeId()}, {"base_snapshot_id", req.GetBaseSnapshotId()},
	} {
		if f.v == "" {
			return nil, status.Errorf(codes.InvalidArgument, "%s: must be set", f.name)
		}
	}
	if req.GetSizeBytes() <= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "size_bytes: %d: must be positive", req.GetSizeBytes())
	}
	if err := nodeca.ValidateNodeName(req.GetSourceNode()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "source_node: %v", err)
	}
	if _, _, err := volume.ParseVolumeID(req.GetSourceVolumeId()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "source_volume_id: %v", err)
	}
	res, err := c.Target.CatchUp(ctx, provision.CatchUpRequest{
		VolumeID: req.GetTargetVolumeId(), Base: req.GetBaseSnapshotId(),
		Source: provision.RemoteSource{CopyID: req.GetCopyId(), ID: req.GetSourceVolumeId(), Node: req.GetSourceNode(),
			Address: req.GetSourceAddress(), Size: uint64(req.GetSizeBytes())},
	})
	if errors.Is(err, ErrChecksum) {
		return nil, status.Errorf(codes.DataLoss, "catch-up of %s: %v", req.GetTargetVolumeId(), err)
	}
	if err != nil {
		return nil, nodestatus.OfRead(err, "catch-up of "+req.GetTargetVolumeId())
	}
	return &nodeagentv1.CatchUpCopyResponse{ReceivedBytes: int64(res.Received), Digest: res.Sum}, nil
}
