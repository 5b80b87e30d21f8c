package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/lvmname"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// ControllerConfig holds what the Controller server needs; main builds it.
type ControllerConfig struct {
	// Config is the provisioner the server maps to.
	provision.Config
	// FSTypes are the filesystems this node can make.
	FSTypes []string
	// Limits applies recorded IO limits to published pods; nil only records them.
	Limits LimitApplier
}

// LimitApplier applies a volume's IO limits to the pods it is published to.
type LimitApplier interface {
	// ApplyIOLimits writes limits into the io.max of every pod that has the
	// volume published and returns how many; errors are gRPC statuses.
	ApplyIOLimits(ctx context.Context, vol volume.ID, limits volume.IOLimits) (int, error)
}

// ControllerServer implements csi.ControllerServer for this node's volume
// groups, mapping requests to its Provisioner.
type ControllerServer struct {
	csi.UnimplementedControllerServer
	cfg  ControllerConfig
	node nodeTopology
	p    *provision.Provisioner
}

var _ csi.ControllerServer = (*ControllerServer)(nil)

// NewControllerServer returns the Controller server of cfg.
func NewControllerServer(cfg ControllerConfig) *ControllerServer {
	return &ControllerServer{cfg: cfg, node: nodeTopology{name: cfg.NodeName}, p: provision.New(cfg.Config)}
}

// Provisioner is the lifecycle the server maps to.
func (s *ControllerServer) Provisioner() *provision.Provisioner { return s.p }

// ControllerGetCapabilities implements csi.ControllerServer.
func (s *ControllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return csiserver.ControllerCapabilities(csiserver.NodeControllerRPCs...), nil
}

// CreateVolume implements csi.ControllerServer; it is idempotent.
func (s *ControllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (resp *csi.CreateVolumeResponse, err error) {
	phase := sourcePhase(req.GetVolumeContentSource())
	op := s.cfg.Metrics.Begin(phase, csiserver.ResultOf)
	defer op.End(&err)

	r, err := s.createRequest(req)
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	op.SetClass(r.Class.Name)
	if !s.node.accepts(req.GetAccessibilityRequirements()) {
		// CSI idempotency: a volume made here answers its repeat whatever the
		// requisite says now; Create checks it matches.
		if _, made := s.cfg.View.FindLV(volume.LVNameFor(r.Name)); !made {
			return nil, status.Errorf(codes.ResourceExhausted, "accessibility_requirements: the requisite topology does not include this node (%s=%s)", topology.Key, s.node.name)
		}
	}
	lv, err := s.p.Create(ctx, r)
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	v := s.volume(lv, r.Class.Name)
	v.VolumeContext[volume.ContextVolumeName] = r.Name
	if r.Encryption != nil {
		v.VolumeContext[volume.ParamEncryption] = volume.EncryptionLUKS2
		v.VolumeContext[volume.ContextKeyID] = r.Encryption.Token.KeyID
	}
	v.ContentSource = req.GetVolumeContentSource()
	return &csi.CreateVolumeResponse{Volume: v}, nil
}

func (s *ControllerServer) createRequest(req *csi.CreateVolumeRequest) (*provision.Request, error) {
	if err := checkVolumeName(req.GetName()); err != nil {
		return nil, err
	}
	fsType, err := checkCapabilities(req.GetVolumeCapabilities(), s.cfg.FSTypes)
	if err != nil {
		return nil, err
	}
	wantSource, err := sourceTags(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	class, err := classFromParameters(req.GetParameters(), s.cfg.Classes, s.node.name)
	if err != nil {
		return nil, err
	}
	limits, err := ioLimitsFromRequest(req.GetParameters(), req.GetMutableParameters())
	if err != nil {
		return nil, err
	}
	enc, err := encryptionFromRequest(req)
	if err != nil {
		return nil, err
	}
	r := &provision.Request{Name: req.GetName(), Class: class, FSType: fsType, Params: req.GetParameters(), SourceTags: wantSource, IOLimits: limits, Encryption: enc,
		Range: provision.Range{Required: req.GetCapacityRange().GetRequiredBytes(), Limit: req.GetCapacityRange().GetLimitBytes()}}
	for _, c := range req.GetVolumeCapabilities() {
		r.Block = r.Block || c.GetBlock() != nil
	}
	switch cs := req.GetVolumeContentSource(); {
	case cs.GetSnapshot() != nil:
		r.Source = &provision.Source{ID: cs.GetSnapshot().GetSnapshotId(), Snapshot: true}
	case cs.GetVolume() != nil:
		r.Source = &provision.Source{ID: cs.GetVolume().GetVolumeId()}
	}
	return r, nil
}

func (s *ControllerServer) volume(lv *lvm.LogicalVolume, class string) *csi.Volume {
	return &csi.Volume{
		VolumeId:           volume.VolumeID(lv.VolumeGroup, lv.Name),
		CapacityBytes:      int64(lv.Size),
		VolumeContext:      map[string]string{volume.ParamDeviceClass: class},
		AccessibleTopology: []*csi.Topology{s.node.segment()},
	}
}

// DeleteVolume implements csi.ControllerServer. An ID that is not carve's,
// or an LV gone from a present volume group, is success.
func (s *ControllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (resp *csi.DeleteVolumeResponse, err error) {
	op := s.cfg.Metrics.Begin(metrics.PhaseDelete, csiserver.ResultOf)
	defer op.End(&err)

	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	vg, lvName, perr := volume.ParseVolumeID(id)
	if perr != nil || lvmname.VG(vg) != nil || lvmname.LV(lvName) != nil {
		klog.FromContext(ctx).V(2).Info("DeleteVolume of an ID that is not carve's; nothing to do", "volumeID", id)
		return &csi.DeleteVolumeResponse{}, nil
	}
	class, err := s.p.Delete(ctx, vg, lvName, id)
	op.SetClass(class)
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	return &csi.DeleteVolumeResponse{}, nil
}
