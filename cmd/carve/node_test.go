package main

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/csiserver"
)

// TestSocketServices: the --endpoint socket serves the Controller service
// without the node channel or when asked, never otherwise, and its
// Identity says which.
func TestSocketServices(t *testing.T) {
	all := csiserver.Services{
		Identity:   csiserver.NewIdentityServer(csiserver.IdentityConfig{Name: "lvm.carve.dev", Topology: true}),
		Controller: csiserver.ResizerOnlyController{},
		Node:       &csi.UnimplementedNodeServer{},
	}
	tests := []struct {
		name           string
		channel        NodeChannelOptions
		wantController bool
	}{
		{name: "no node channel", wantController: true},
		{name: "node channel", channel: NodeChannelOptions{Address: "10.0.0.1:9809"}},
		{name: "node channel and --controller-on-socket", channel: NodeChannelOptions{Address: "10.0.0.1:9809", ControllerOnSocket: true}, wantController: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := socketServices(&NodeOptions{CommonOptions: CommonOptions{DriverName: "lvm.carve.dev"}, NodeChannel: tt.channel}, all, nil)
			if (got.Controller != nil) != tt.wantController {
				t.Errorf("Controller served: %v, want %v", got.Controller != nil, tt.wantController)
			}
			if got.Node == nil || got.Identity == nil {
				t.Fatal("the socket lost its Identity or Node service")
			}
			caps, err := got.Identity.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			advertised := false
			for _, c := range caps.GetCapabilities() {
				advertised = advertised || c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE
			}
			if advertised != tt.wantController {
				t.Errorf("Identity advertises CONTROLLER_SERVICE: %v, want %v", advertised, tt.wantController)
			}
		})
	}
}
