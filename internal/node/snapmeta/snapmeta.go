// Package snapmeta answers the node channel's SnapshotBlocks with pages of
// extents of snapshot block maps; the controller serves them as CSI
// SnapshotMetadata.
package snapmeta

import (
	"context"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
)

// DefaultMaxResults: 1024 extents are 16 KiB of protobuf, well under gRPC's
// 4 MiB limit.
const DefaultMaxResults = 1024

// Source makes block maps; *provision.Provisioner is one.
type Source interface {
	SnapshotAllocated(ctx context.Context, id string) (provision.BlockMap, error)
	SnapshotDelta(ctx context.Context, baseID, targetID string) (provision.BlockMap, error)
}

// Server answers SnapshotBlocks from Source.
type Server struct {
	Source Source
}

// SnapshotBlocks implements the node channel's SnapshotBlocks. The whole map
// is made before the first message, so no lock or metadata snapshot is held
// while the client reads.
func (s *Server) SnapshotBlocks(req *nodeagentv1.SnapshotBlocksRequest, stream nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
	ctx := stream.Context()
	if req.GetMaxResults() < 0 {
		return status.Errorf(codes.InvalidArgument, "max_results: %d is negative", req.GetMaxResults())
	}
	if req.GetStartingOffset() < 0 {
		return status.Errorf(codes.OutOfRange, "starting_offset: %d is negative", req.GetStartingOffset())
	}
	var m provision.BlockMap
	var err error
	if req.GetBaseSnapshotId() == "" {
		m, err = s.Source.SnapshotAllocated(ctx, req.GetSnapshotId())
	} else {
		m, err = s.Source.SnapshotDelta(ctx, req.GetBaseSnapshotId(), req.GetSnapshotId())
	}
	if err != nil {
		return nodestatus.OfRead(err, "")
	}
	if m.Capacity > math.MaxInt64 {
		return status.Errorf(codes.Internal, "snapshot_id: the volume's capacity %d is out of range", m.Capacity)
	}
	if uint64(req.GetStartingOffset()) > m.Capacity {
		return status.Errorf(codes.OutOfRange, "starting_offset: %d is beyond the volume's capacity of %d bytes", req.GetStartingOffset(), m.Capacity)
	}
	blocks := From(m.Blocks, uint64(req.GetStartingOffset()))
	klog.FromContext(ctx).V(2).Info("Sending snapshot blocks", "snapshotID", req.GetSnapshotId(), "base", req.GetBaseSnapshotId(),
		"method", m.Method, "extents", len(blocks), "bytes", blocks.Bytes())
	per := int(req.GetMaxResults())
	if per == 0 {
		per = DefaultMaxResults
	}
	for _, page := range Pages(blocks, per) {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		resp := &nodeagentv1.SnapshotBlocksResponse{SnapshotId: req.GetSnapshotId(), BaseSnapshotId: req.GetBaseSnapshotId(),
			VolumeCapacityBytes: int64(m.Capacity), Blocks: make([]*nodeagentv1.BlockExtent, 0, len(page))}
		for _, e := range page {
			resp.Blocks = append(resp.Blocks, &nodeagentv1.BlockExtent{Offset: int64(e.Off), Length: int64(e.Len)})
		}
		if err := stream.Send(resp); err != nil {
			return fmt.Errorf("sending snapshot blocks: %w", err)
		}
	}
	return nil
}

// From is s from the extent holding start, or the first after it.
func From(s changemap.Set, start uint64) changemap.Set {
	for i, e := range s {
		if e.Off+e.Len > start {
			return s[i:]
		}
	}
	return nil
}

// Pages cuts s into pages of at most per extents.
func Pages(s changemap.Set, per int) []changemap.Set {
	var pages []changemap.Set
	for len(s) > 0 {
		n := min(per, len(s))
		pages = append(pages, s[:n])
		s = s[n:]
	}
	return pages
}
