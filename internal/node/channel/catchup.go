package channel

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// CatchUps takes a move's last copy; peercopy.CatchUps is one.
type CatchUps interface {
	CatchUpCopy(ctx context.Context, req *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error)
}

// CatchUpCopy implements nodeagentv1.NodeAgentServer.
func (a *Agent) CatchUpCopy(ctx context.Context, req *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error) {
	if a.cfg.CatchUps == nil {
		return nil, status.Errorf(codes.Unimplemented, "node %s takes no catch-ups from other nodes (it has no node channel's certificate to read them with)", a.cfg.NodeName)
	}
	return a.cfg.CatchUps.CatchUpCopy(ctx, req)
}
