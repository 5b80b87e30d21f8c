package csiserver

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
)

func TestIdentity(t *testing.T) {
	ctx := context.Background()
	var readyErr error
	s := NewIdentityServer(IdentityConfig{Name: "lvm.carve.dev", Version: "v1.2.3", Topology: true,
		Ready: func(context.Context) error { return readyErr }})

	info, err := s.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "lvm.carve.dev" || info.GetVendorVersion() != "v1.2.3" {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
	_, err = NewIdentityServer(IdentityConfig{}).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	csitest.WantCode(t, err, codes.Unavailable)

	caps, err := s.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var services []csi.PluginCapability_Service_Type
	var expansion []csi.PluginCapability_VolumeExpansion_Type
	for _, c := range caps.GetCapabilities() {
		if c.GetService() != nil {
			services = append(services, c.GetService().GetType())
		}
		if c.GetVolumeExpansion() != nil {
			expansion = append(expansion, c.GetVolumeExpansion().GetType())
		}
	}
	if len(services) != 2 || services[0] != csi.PluginCapability_Service_CONTROLLER_SERVICE ||
		services[1] != csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
		t.Errorf("services = %v", services)
	}
	if len(expansion) != 1 || expansion[0] != csi.PluginCapability_VolumeExpansion_ONLINE {
		t.Errorf("expansion = %v", expansion)
	}
	local, _ := NewIdentityServer(IdentityConfig{Name: "x", Topology: true, NoController: true}).GetPluginCapabilities(ctx, nil)
	for _, c := range local.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			t.Error("a node socket without the Controller service advertises it")
		}
	}
	central, _ := NewIdentityServer(IdentityConfig{Name: "x"}).GetPluginCapabilities(ctx, nil)
	for _, c := range central.GetCapabilities() {
		if ty := c.GetService().GetType(); ty == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS || ty == csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS {
			t.Error("the central role advertises topology")
		}
		if c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE {
			t.Error("a socket without the SnapshotMetadata service advertises it")
		}
	}
	routing, _ := NewIdentityServer(IdentityConfig{Name: "x", Topology: true, SnapshotMetadata: true}).GetPluginCapabilities(ctx, nil)
	if !slices.ContainsFunc(routing.GetCapabilities(), func(c *csi.PluginCapability) bool {
		return c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
	}) {
		t.Errorf("the routing controller does not advertise SNAPSHOT_METADATA_SERVICE: %v", routing.GetCapabilities())
	}

	for _, tt := range []struct {
		name  string
		err   error
		ready bool
	}{{"ready", nil, true}, {"vg missing", errors.New("volume group vg1 is missing"), false}} {
		readyErr = tt.err
		p, err := s.Probe(ctx, &csi.ProbeRequest{})
		if err != nil || p.GetReady() == nil || p.GetReady().GetValue() != tt.ready {
			t.Errorf("%s: Probe = %v, %v; want ready %v", tt.name, p, err, tt.ready)
		}
	}
	p, err := NewIdentityServer(IdentityConfig{Name: "x"}).Probe(ctx, nil)
	if err != nil || !p.GetReady().GetValue() {
		t.Errorf("Probe without a readiness check = %v, %v", p, err)
	}
}
