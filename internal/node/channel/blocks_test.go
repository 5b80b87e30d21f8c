package channel

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// blocksFunc is a Blocks.
type blocksFunc func(*nodeagentv1.SnapshotBlocksRequest, nodeagentv1.NodeAgent_SnapshotBlocksServer) error

func (f blocksFunc) SnapshotBlocks(req *nodeagentv1.SnapshotBlocksRequest, s nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
	return f(req, s)
}

// TestSnapshotBlocks: an agent without Blocks answers UNIMPLEMENTED; one
// with them hands the stream over, its error unchanged.
func TestSnapshotBlocks(t *testing.T) {
	req := &nodeagentv1.SnapshotBlocksRequest{SnapshotId: "node-a/vg/carvesnap-1"}
	var handed bool
	for _, tt := range []struct {
		name   string
		blocks Blocks
		want   codes.Code
	}{
		{name: "no blocks", want: codes.Unimplemented},
		{name: "handed over", blocks: blocksFunc(func(r *nodeagentv1.SnapshotBlocksRequest, _ nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
			handed = r == req
			return nil
		})},
		{name: "refused", blocks: blocksFunc(func(*nodeagentv1.SnapshotBlocksRequest, nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
			return status.Error(codes.NotFound, "snapshot_id: gone")
		}), want: codes.NotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &Agent{cfg: Config{NodeName: node, Blocks: tt.blocks}}
			if err := a.SnapshotBlocks(req, nil); status.Code(err) != tt.want {
				t.Fatalf("SnapshotBlocks: %v, want %s", err, tt.want)
			}
		})
	}
	if !handed {
		t.Error("the request was not handed over")
	}
}
