package channel

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// Blocks names snapshot blocks; *snapmeta.Server is one.
type Blocks interface {
	SnapshotBlocks(req *nodeagentv1.SnapshotBlocksRequest, stream nodeagentv1.NodeAgent_SnapshotBlocksServer) error
}

// SnapshotBlocks implements nodeagentv1.NodeAgentServer.
func (a *Agent) SnapshotBlocks(req *nodeagentv1.SnapshotBlocksRequest, stream nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
	if a.cfg.Blocks == nil {
		return status.Errorf(codes.Unimplemented, "node %s names no snapshot blocks", a.cfg.NodeName)
	}
	return a.cfg.Blocks.SnapshotBlocks(req, stream)
}
