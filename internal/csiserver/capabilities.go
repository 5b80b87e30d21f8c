package csiserver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// ControllerRPCs are the routing controller's capabilities; it writes CSIStorageCapacity
// itself, nodes grow volumes, and nothing attaches.
var ControllerRPCs = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
}

// NodeControllerRPCs are a node agent's on the node channel: ControllerRPCs and GET_CAPACITY.
var NodeControllerRPCs = append([]csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_GET_CAPACITY}, ControllerRPCs...)

// ControllerCapabilities is the ControllerGetCapabilities answer of types.
func ControllerCapabilities(types ...csi.ControllerServiceCapability_RPC_Type) *csi.ControllerGetCapabilitiesResponse {
	caps := make([]*csi.ControllerServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}
}

// NodeCapabilities is the NodeGetCapabilities answer of types.
func NodeCapabilities(types ...csi.NodeServiceCapability_RPC_Type) *csi.NodeGetCapabilitiesResponse {
	caps := make([]*csi.NodeServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}
}

// ResizerOnlyController advertises nothing, so csi-resizer leaves growing to the kubelet.
type ResizerOnlyController struct {
	csi.UnimplementedControllerServer
}

var _ csi.ControllerServer = ResizerOnlyController{}

// ControllerGetCapabilities implements csi.ControllerServer.
func (ResizerOnlyController) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return ControllerCapabilities(), nil
}

// ResizerOnlyNode answers NodeGetCapabilities with EXPAND_VOLUME: csi-resizer asks the
// controller socket and refuses to start if the call fails.
type ResizerOnlyNode struct {
	csi.UnimplementedNodeServer
}

var _ csi.NodeServer = ResizerOnlyNode{}

// NodeGetCapabilities implements csi.NodeServer.
func (ResizerOnlyNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return NodeCapabilities(csi.NodeServiceCapability_RPC_EXPAND_VOLUME), nil
}
