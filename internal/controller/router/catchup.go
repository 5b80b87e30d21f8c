package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/volume"
)

// CatchUpCopy is a move's catch-up: targetVolumeID, restored from
// baseSnapshotID (a snapshot of sourceVolumeID) on targetNode, gets the
// chunks where the source now differs from the base, and the bytes sent are
// returned. The source's node comes from the snapshot ID; the target is
// asked about on targetNode only, so no other node's answer decides where
// it is. The source's agent grants one read of the delta (AuthorizeCopy),
// and the target's agent reads it and checks the whole content first.
//
// Errors: INVALID_ARGUMENT for bad arguments; NOT_FOUND for a source no node
// has; FAILED_PRECONDITION for a base of another node, or source and target
// on one node; UNAVAILABLE for an agent not connected (maybe restarting);
// UNIMPLEMENTED for an agent without catch-ups. Agent answers keep their
// codes: FAILED_PRECONDITION for a source or target still open (retry), the
// same with a moveapi Error* reason for a lasting refusal, DATA_LOSS for a
// target that did not check out. A repeat starts again.
func (s *Server) CatchUpCopy(ctx context.Context, sourceVolumeID, baseSnapshotID, targetNode, targetVolumeID string) (received int64, err error) {
	for _, a := range []struct{ name, v string }{{"source volume ID", sourceVolumeID}, {"base snapshot ID", baseSnapshotID},
		{"target node", targetNode}, {"target volume ID", targetVolumeID}} {
		if a.v == "" {
			return 0, status.Errorf(codes.InvalidArgument, "catch-up: the %s must be set", a.name)
		}
	}
	if s.cfg.Agents == nil {
		return 0, status.Error(codes.Unimplemented, "catch-up: this controller makes no copies across nodes")
	}
	from, _, _, err := volume.ParseSnapshotID(baseSnapshotID)
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "catch-up: base snapshot ID %q: %v", baseSnapshotID, err)
	}
	for _, id := range []string{sourceVolumeID, targetVolumeID} {
		if _, _, err := volume.ParseVolumeID(id); err != nil {
			return 0, status.Errorf(codes.InvalidArgument, "catch-up: volume ID %q: %v", id, err)
		}
	}
	srcNode, err := s.catchUpNode(ctx, sourceVolumeID, "source")
	if err != nil {
		return 0, err
	}
	if srcNode != from {
		return 0, status.Errorf(codes.FailedPrecondition, "catch-up: the source volume %s is on node %s, its base snapshot %s on node %s", sourceVolumeID, srcNode, baseSnapshotID, from)
	}
	to := targetNode
	if to == from {
		return 0, status.Errorf(codes.FailedPrecondition, "catch-up: the source volume %s and the target %s are both on node %s", sourceVolumeID, targetVolumeID, from)
	}
	log := klog.FromContext(ctx).WithValues("source", sourceVolumeID, "sourceNode", from, "base", baseSnapshotID, "target", targetVolumeID, "node", to)
	src, err := s.cfg.Agents.NodeAgent(ctx, from)
	if err != nil {
		return 0, unreachable(ctx, from, err)
	}
	host, err := s.cfg.Agents.Host(from)
	if err != nil {
		return 0, unreachable(ctx, from, err)
	}
	dst, err := s.cfg.Agents.NodeAgent(ctx, to)
	if err != nil {
		return 0, unreachable(ctx, to, err)
	}
	copyID, err := newCopyID()
	if err != nil {
		return 0, status.Errorf(codes.Internal, "a copy ID: %v", err)
	}
	grant, err := src.AuthorizeCopy(ctx, &nodeagentv1.AuthorizeCopyRequest{CopyId: copyID, VolumeId: sourceVolumeID, BaseSnapshotId: baseSnapshotID,
		TargetNode: to, TargetVolumeName: targetVolumeID, ValidSeconds: copyGrantValidity})
	if err != nil {
		return 0, catchUpError(from, "granting the catch-up of "+sourceVolumeID+" against "+baseSnapshotID+" to node "+to, err)
	}
	log.V(2).Info("Granted a catch-up", "copy", copyID, "size", grant.GetSizeBytes())
	resp, err := dst.CatchUpCopy(ctx, &nodeagentv1.CatchUpCopyRequest{TargetVolumeId: targetVolumeID, CopyId: copyID,
		SourceNode: from, SourceAddress: net.JoinHostPort(host, strconv.Itoa(int(grant.GetCopyPort()))),
		SourceVolumeId: sourceVolumeID, BaseSnapshotId: baseSnapshotID, SizeBytes: grant.GetSizeBytes()})
	if err != nil {
		return 0, catchUpError(to, "catching up "+targetVolumeID+" from "+sourceVolumeID+" on node "+from, err)
	}
	log.Info("Caught up a volume with its source on another node", "copy", copyID, "receivedBytes", resp.GetReceivedBytes())
	return resp.GetReceivedBytes(), nil
}

func (s *Server) catchUpNode(ctx context.Context, id, what string) (string, error) {
	node, err := s.nodeOfVolume(ctx, id)
	if errors.Is(err, errNoVolume) {
		return "", status.Errorf(codes.NotFound, "catch-up: the %s volume %s is on no node", what, id)
	}
	if err != nil {
		st := status.Convert(err)
		return "", status.Errorf(st.Code(), "catch-up: the %s volume: %s", what, st.Message())
	}
	return node, nil
}

func unreachable(ctx context.Context, node string, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.Unavailable, "catch-up: the agent of node %s is unreachable; nothing was sent: %v", node, err)
}

// catchUpError keeps the node's code and details: a reason tells the mover
// a refusal no retry mends.
func catchUpError(node, doing string, err error) error {
	p := status.Convert(err).Proto()
	p.Message = fmt.Sprintf("catch-up: %s: node %s: %s", doing, node, p.GetMessage())
	return status.FromProto(p).Err()
}
