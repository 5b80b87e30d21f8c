package csiserver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// ControllerRPCs are the Controller capabilities carve's controller
// serves to the sidecars, routing each call to the node that owns it. Not
// advertised:
//   - GET_CAPACITY: the controller writes CSIStorageCapacity objects
//     itself from the nodes' capacity streams (csi-provisioner runs
//     without --enable-capacity); a node agent answers it for its own
//     classes (NodeControllerRPCs).
//   - EXPAND_VOLUME: the node agents do not serve ControllerExpandVolume;
//     NodeExpandVolume grows the volume.
//   - PUBLISH_UNPUBLISH_VOLUME: carve attaches nothing.
//
// MODIFY_VOLUME changes a volume's IO limits (VolumeAttributesClass).
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

// NodeControllerRPCs are those a node agent's Controller serves, for its
// own volume groups, on the node channel: the controller's and
// GET_CAPACITY.
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

// ResizerOnlyController is the Controller of `carve controller` when it
// routes nothing (no --node-channel-service): it advertises no capability,
// so csi-resizer only records a new size on the PersistentVolume and
// leaves the growing to the kubelet. Every other call is Unimplemented.
type ResizerOnlyController struct {
	csi.UnimplementedControllerServer
}

var _ csi.ControllerServer = ResizerOnlyController{}

// ControllerGetCapabilities implements csi.ControllerServer.
func (ResizerOnlyController) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return ControllerCapabilities(), nil
}

// ResizerOnlyNode is the Node service of `carve controller`'s socket. It
// only answers NodeGetCapabilities with EXPAND_VOLUME: csi-resizer, finding
// no controller expansion, asks the same socket whether the node side
// expands, and refuses to start when that call fails. The real Node
// service runs in `carve node` on each node.
type ResizerOnlyNode struct {
	csi.UnimplementedNodeServer
}

var _ csi.NodeServer = ResizerOnlyNode{}

// NodeGetCapabilities implements csi.NodeServer.
func (ResizerOnlyNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return NodeCapabilities(csi.NodeServiceCapability_RPC_EXPAND_VOLUME), nil
}
