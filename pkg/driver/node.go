package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/pkg/fs"
	"github.com/carve-csi/carve/pkg/metrics"
)

// NodeConfig holds what the Node server needs; main builds the real ones.
type NodeConfig struct {
	// NodeName is the Kubernetes node name: the node ID and the value of
	// the topology segment.
	NodeName string
	// MaxVolumes is max_volumes_per_node; 0 means no limit.
	MaxVolumes int64
	// LVM is the same interface the controller uses.
	LVM LVM
	// FS formats, mounts, grows and measures filesystems: fs.New with the
	// real mounter and exec in main, fakes in tests.
	FS fs.Interface
	// Metrics records phases and steps; nil records nothing.
	Metrics *metrics.Recorder
	// OnChange is called after an LVM mutation (lvextend) so the in-memory
	// capacity view refreshes; may be nil.
	OnChange func()
}

// NodeServer implements csi.NodeServer.
type NodeServer struct {
	csi.UnimplementedNodeServer
	cfg NodeConfig
}

var _ csi.NodeServer = (*NodeServer)(nil)

// NewNodeServer returns the Node server of cfg.
func NewNodeServer(cfg NodeConfig) *NodeServer {
	return &NodeServer{cfg: cfg}
}

// NodeStageVolume is being written.
func (n *NodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "NodeStageVolume is not implemented yet")
}
