package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// CentralControllerServer is the Controller service of the `carve
// controller` role, which runs beside csi-resizer. carve grows volumes on
// the node (NodeExpandVolume), so it advertises no controller capability:
// csi-resizer then only records the new size on the PersistentVolume and
// leaves the growing to kubelet. Every other call is Unimplemented.
type CentralControllerServer struct {
	csi.UnimplementedControllerServer
}

var _ csi.ControllerServer = CentralControllerServer{}

// ControllerGetCapabilities implements csi.ControllerServer.
func (CentralControllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return controllerCapabilities(nil), nil
}

// CentralNodeServer is the Node service of the `carve controller` role. It
// only answers NodeGetCapabilities with EXPAND_VOLUME: csi-resizer, finding
// no controller expansion, asks the same socket whether the node side
// expands, and refuses to start when that call fails. Every other call is
// Unimplemented; the real Node service runs in `carve node` on each node.
type CentralNodeServer struct {
	csi.UnimplementedNodeServer
}

var _ csi.NodeServer = CentralNodeServer{}

// NodeGetCapabilities implements csi.NodeServer.
func (CentralNodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return nodeCapabilities(csi.NodeServiceCapability_RPC_EXPAND_VOLUME), nil
}
