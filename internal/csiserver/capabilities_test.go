package csiserver

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
)

// TestResizerOnlyController: carve controller without routing advertises
// no Controller capability (expansion is node-side); the node's Controller
// adds only GET_CAPACITY to the router's.
func TestResizerOnlyController(t *testing.T) {
	central, err := ResizerOnlyController{}.ControllerGetCapabilities(context.Background(), nil)
	if err != nil || len(central.GetCapabilities()) != 0 {
		t.Errorf("capabilities = %v, %v; want none (expansion is node-side)", central, err)
	}
	if len(NodeControllerRPCs) != len(ControllerRPCs)+1 || NodeControllerRPCs[0] != csi.ControllerServiceCapability_RPC_GET_CAPACITY {
		t.Errorf("the node's Controller capabilities %v are not the router's %v and GET_CAPACITY", NodeControllerRPCs, ControllerRPCs)
	}
}

// TestResizerOnlyNode: csi-resizer asks the controller's socket for
// NodeGetCapabilities when it finds no controller expansion, and refuses to
// start unless the answer holds EXPAND_VOLUME. Nothing else is served.
func TestResizerOnlyNode(t *testing.T) {
	ctx := context.Background()
	got := csitest.NodeCapabilityTypes(t, ResizerOnlyNode{})
	if len(got) != 1 || got[0] != csi.NodeServiceCapability_RPC_EXPAND_VOLUME {
		t.Errorf("central node capabilities = %v, want only EXPAND_VOLUME", got)
	}
	_, err := ResizerOnlyNode{}.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vg/lv", VolumePath: "/x"})
	csitest.WantCode(t, err, codes.Unimplemented)
	_, err = ResizerOnlyNode{}.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{})
	csitest.WantCode(t, err, codes.Unimplemented)
}
