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
