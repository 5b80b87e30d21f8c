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

// CatchUpCopy is the catch-up of a move (internal/controller/mover): the volume
// targetVolumeID, made on another node by a restore of baseSnapshotID
// (a snapshot of sourceVolumeID) on targetNode, gets the chunks where
// sourceVolumeID now differs from the base. It finds the source's node
// from the snapshot ID (and checks that the volume is there); the target
// is on the node the caller names, which is the only node asked about
// it: no other node's answer (or silence) decides where the target is.
// It has the source's agent grant the
// target's node one read of the delta (AuthorizeCopy with the base),
// and has the target's agent read it (CatchUpCopy), which checks the
// target's whole content against the source's before it answers. It
// returns the bytes of data the target received.
//
// Errors are gRPC statuses naming the volumes and nodes: an argument
// missing or malformed is INVALID_ARGUMENT; a source that no node has is
// NOT_FOUND; a base of another node than the source volume, or source
// and target on one node, is FAILED_PRECONDITION; a node agent not
// connected is UNAVAILABLE (the target's node too: absent from the pool
// now, it may be back in a moment, as in a rolling update); an agent that does not serve catch-ups is
// UNIMPLEMENTED. The agents' own answers keep their codes and details:
// notably FAILED_PRECONDITION for a source or target still open (the
// workload has not let go of it yet: retry), the same code with an
// ErrorInfo reason (moveapi's Error*) for a refusal no retry mends, and
// DATA_LOSS for a target whose content did not check out (it keeps its
// copy-pending tag). A repeat starts the catch-up again and converges
// where the cause went away.
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

// catchUpNode is the node of a volume of a catch-up (what says which).
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

// unreachable is the status of a node agent a catch-up cannot call.
func unreachable(ctx context.Context, node string, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.Unavailable, "catch-up: the agent of node %s is unreachable; nothing was sent: %v", node, err)
}

// catchUpError is a node's answer to a catch-up's call, its code and
// details kept: a reason there tells the mover a refusal no retry mends.
func catchUpError(node, doing string, err error) error {
	p := status.Convert(err).Proto()
	p.Message = fmt.Sprintf("catch-up: %s: node %s: %s", doing, node, p.GetMessage())
	return status.FromProto(p).Err()
}
