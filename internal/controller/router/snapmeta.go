package router

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/volume"
)

// The CSI SnapshotMetadata service: a snapshot's ID names its node, so each
// stream goes to that agent's SnapshotBlocks and is passed on as
// VARIABLE_LENGTH extents, each message checked first. A node is trusted
// only about its own snapshots: another snapshot, a capacity change
// mid-stream, or an extent empty, beyond capacity, before starting_offset,
// out of order, overlapping or past max_results ends the stream INTERNAL.

// Metadata implements csi.SnapshotMetadataServer by routing.
type Metadata struct {
	csi.UnimplementedSnapshotMetadataServer
	s *Server
}

var _ csi.SnapshotMetadataServer = (*Metadata)(nil)

// Metadata is the router's SnapshotMetadata service.
func (s *Server) Metadata() *Metadata { return &Metadata{s: s} }

// GetMetadataAllocated implements csi.SnapshotMetadataServer.
func (m *Metadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	if req.GetSnapshotId() == "" {
		return status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, err := snapshotNode("snapshot_id", req.GetSnapshotId())
	if err != nil {
		return err
	}
	ask := &nodeagentv1.SnapshotBlocksRequest{SnapshotId: req.GetSnapshotId(), StartingOffset: req.GetStartingOffset(), MaxResults: req.GetMaxResults()}
	return m.relay(stream.Context(), node, "GetMetadataAllocated", ask, func(capacity int64, blocks []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: capacity, BlockMetadata: blocks})
	})
}

// GetMetadataDelta implements csi.SnapshotMetadataServer.
func (m *Metadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	for _, f := range []struct{ field, v string }{{"base_snapshot_id", req.GetBaseSnapshotId()}, {"target_snapshot_id", req.GetTargetSnapshotId()}} {
		if f.v == "" {
			return status.Errorf(codes.InvalidArgument, "%s: must be set", f.field)
		}
	}
	node, err := snapshotNode("target_snapshot_id", req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	baseNode, err := snapshotNode("base_snapshot_id", req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	if baseNode != node {
		return status.Errorf(codes.InvalidArgument, "base_snapshot_id: snapshot %s is on node %s, target_snapshot_id %s on node %s: a delta is between two snapshots of one volume",
			req.GetBaseSnapshotId(), baseNode, req.GetTargetSnapshotId(), node)
	}
	ask := &nodeagentv1.SnapshotBlocksRequest{SnapshotId: req.GetTargetSnapshotId(), BaseSnapshotId: req.GetBaseSnapshotId(),
		StartingOffset: req.GetStartingOffset(), MaxResults: req.GetMaxResults()}
	return m.relay(stream.Context(), node, "GetMetadataDelta", ask, func(capacity int64, blocks []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: capacity, BlockMetadata: blocks})
	})
}

// snapshotNode is the node a snapshot ID names; a foreign ID is NOT_FOUND.
func snapshotNode(field, id string) (string, error) {
	node, _, _, err := volume.ParseSnapshotID(id)
	if err != nil {
		return "", status.Errorf(codes.NotFound, "%s: snapshot %q does not exist: %v", field, id, err)
	}
	return node, nil
}

// relay hands each checked message of node's stream to send; the stream
// lives in the client's ctx, so a client going away cancels it.
func (m *Metadata) relay(ctx context.Context, node, method string, ask *nodeagentv1.SnapshotBlocksRequest, send func(int64, []*csi.BlockMetadata) error) error {
	switch {
	case ask.GetStartingOffset() < 0:
		return status.Errorf(codes.OutOfRange, "starting_offset: %d is negative", ask.GetStartingOffset())
	case ask.GetMaxResults() < 0:
		return status.Errorf(codes.InvalidArgument, "max_results: %d is negative", ask.GetMaxResults())
	case m.s.cfg.Agents == nil:
		return status.Error(codes.Unimplemented, "this controller reaches no node agents")
	}
	logger := klog.FromContext(ctx).WithValues("node", node, "call", method)
	ctx = klog.NewContext(ctx, logger)
	agent, err := m.s.cfg.Agents.NodeAgent(ctx, node)
	if err != nil {
		logger.V(2).Info("Not sent: no connection to the node agent", "err", err.Error())
		return notSent(ctx, node, err, codes.Unavailable)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the node's stream on any return
	in, err := agent.SnapshotBlocks(ctx, ask)
	if err != nil {
		return fromNode(node, err)
	}
	check := blockCheck{ask: ask}
	for {
		resp, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fromNode(node, err)
		}
		if reason, what := check.next(resp); reason != "" {
			return m.s.refuse(ctx, node, method, reason, "%s", what)
		}
		blocks := make([]*csi.BlockMetadata, 0, len(resp.GetBlocks()))
		for _, b := range resp.GetBlocks() {
			blocks = append(blocks, &csi.BlockMetadata{ByteOffset: b.GetOffset(), SizeBytes: b.GetLength()})
		}
		if err := send(resp.GetVolumeCapacityBytes(), blocks); err != nil {
			return fmt.Errorf("sending to the client: %w", err)
		}
	}
}

type blockCheck struct {
	ask      *nodeagentv1.SnapshotBlocksRequest
	capacity int64
	// end is where the last extent ended (starting_offset before the first).
	end     int64
	extents int
	started bool
}

func (c *blockCheck) next(resp *nodeagentv1.SnapshotBlocksResponse) (reason, what string) {
	if resp.GetSnapshotId() != c.ask.GetSnapshotId() || resp.GetBaseSnapshotId() != c.ask.GetBaseSnapshotId() {
		return refusedSnapshotID, fmt.Sprintf("the blocks of snapshot_id %q against %q, asked for %q against %q",
			resp.GetSnapshotId(), resp.GetBaseSnapshotId(), c.ask.GetSnapshotId(), c.ask.GetBaseSnapshotId())
	}
	capacity := resp.GetVolumeCapacityBytes()
	switch {
	case capacity <= 0:
		return refusedBlocks, fmt.Sprintf("volume_capacity_bytes %d", capacity)
	case c.started && capacity != c.capacity:
		return refusedBlocks, fmt.Sprintf("volume_capacity_bytes %d after %d in the same stream", capacity, c.capacity)
	case !c.started && c.ask.GetStartingOffset() > capacity:
		return refusedBlocks, fmt.Sprintf("volume_capacity_bytes %d, below starting_offset %d", capacity, c.ask.GetStartingOffset())
	case c.ask.GetMaxResults() > 0 && len(resp.GetBlocks()) > int(c.ask.GetMaxResults()):
		return refusedBlocks, fmt.Sprintf("%d extents in one message, max_results %d", len(resp.GetBlocks()), c.ask.GetMaxResults())
	}
	if !c.started {
		c.started, c.capacity, c.end = true, capacity, c.ask.GetStartingOffset()
	}
	for _, b := range resp.GetBlocks() {
		off, n := b.GetOffset(), b.GetLength()
		switch {
		case n <= 0 || off < 0 || off > capacity-n:
			return refusedBlocks, fmt.Sprintf("the extent of %d bytes at %d in a volume of %d bytes", n, off, capacity)
		case c.extents == 0 && off+n <= c.end:
			return refusedBlocks, fmt.Sprintf("the first extent [%d, %d), which ends at or before starting_offset %d", off, off+n, c.end)
		case c.extents > 0 && off < c.end:
			return refusedBlocks, fmt.Sprintf("the extent [%d, %d) after one that ends at %d: out of order or overlapping", off, off+n, c.end)
		}
		c.extents++
		c.end = off + n
	}
	return "", ""
}
