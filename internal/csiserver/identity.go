package csiserver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// IdentityConfig holds what the Identity server reports.
type IdentityConfig struct {
	// Name is the CSI driver name (lvm.carve.dev).
	Name string
	// Version is carve's version.
	Version string
	// Topology advertises VOLUME_ACCESSIBILITY_CONSTRAINTS (not the snapshot one, which
	// csi-sanity v5.6.0 fails).
	Topology bool
	// Ready is asked by Probe; nil means always ready.
	Ready func(ctx context.Context) error
	// NoController leaves CONTROLLER_SERVICE out (served only on the node channel).
	NoController bool
	// SnapshotMetadata advertises SNAPSHOT_METADATA_SERVICE.
	SnapshotMetadata bool
}

// IdentityServer implements csi.IdentityServer.
type IdentityServer struct {
	csi.UnimplementedIdentityServer
	cfg IdentityConfig
}

var _ csi.IdentityServer = (*IdentityServer)(nil)

// NewIdentityServer returns the Identity server of cfg.
func NewIdentityServer(cfg IdentityConfig) *IdentityServer {
	return &IdentityServer{cfg: cfg}
}

// GetPluginInfo implements csi.IdentityServer.
func (s *IdentityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	if s.cfg.Name == "" {
		return nil, status.Error(codes.Unavailable, "driver name not configured")
	}
	return &csi.GetPluginInfoResponse{Name: s.cfg.Name, VendorVersion: s.cfg.Version}, nil
}

// GetPluginCapabilities implements csi.IdentityServer.
func (s *IdentityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	var caps []*csi.PluginCapability
	if !s.cfg.NoController {
		caps = append(caps, svc(csi.PluginCapability_Service_CONTROLLER_SERVICE))
	}
	if s.cfg.Topology {
		caps = append(caps, svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS))
	}
	if s.cfg.SnapshotMetadata {
		caps = append(caps, svc(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE))
	}
	caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe implements csi.IdentityServer: not ready while a volume group, pool or LVM fails.
func (s *IdentityServer) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(ctx); err != nil {
			klog.FromContext(ctx).Info("Probe: not ready", "reason", err.Error())
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
