package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/lvmname"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// GetCapacity implements csi.ControllerServer from the in-memory view; it
// reports this node only, 0 bytes for anything it cannot serve.
func (s *ControllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (resp *csi.GetCapacityResponse, err error) {
	op := s.cfg.Metrics.Begin(metrics.PhaseCapacity, csiserver.ResultOf)
	defer op.End(&err)

	none := &csi.GetCapacityResponse{AvailableCapacity: 0, MaximumVolumeSize: wrapperspb.Int64(0)}
	for _, c := range req.GetVolumeCapabilities() {
		if _, err := capability.Parse(c, s.cfg.FSTypes); err != nil {
			return none, nil
		}
	}
	class, err := classFromParameters(req.GetParameters(), s.cfg.Classes, s.node.name)
	if errors.Is(err, provision.ErrElsewhere) || (err != nil && len(req.GetParameters()) == 0) {
		return none, nil
	}
	if err != nil {
		return nil, err
	}
	op.SetClass(class.Name)
	if !s.node.hasCapacityIn(req.GetAccessibleTopology()) {
		return none, nil
	}
	room, err := s.cfg.View.Capacity(class)
	if errors.Is(err, vgview.ErrClassUnavailable) {
		return none, nil
	}
	if err != nil {
		return nil, nodestatus.Of(err, "capacity of device class "+class.Name)
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: int64(room.Available),
		MaximumVolumeSize: wrapperspb.Int64(int64(room.MaxVolume)),
		MinimumVolumeSize: wrapperspb.Int64(int64(room.ExtentSize)),
	}, nil
}

// ListVolumes implements csi.ControllerServer from the view. The token is the
// last ID of the previous page, so a deletion does not shift pages.
func (s *ControllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	token := req.GetStartingToken()
	if err := checkPage(req.GetMaxEntries(), token); err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{}
	for _, lv := range s.cfg.View.Volumes() {
		id := volume.VolumeID(lv.VolumeGroup, lv.Name)
		if (token != "" && id <= token) || !s.p.Available(&lv) {
			continue
		}
		if limit := int(req.GetMaxEntries()); limit > 0 && len(resp.Entries) == limit {
			resp.NextToken = resp.Entries[limit-1].GetVolume().GetVolumeId()
			break
		}
		class, _ := volume.ClassFromTags(lv.Tags)
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: s.volume(&lv, class),
		})
	}
	return resp, nil
}

// checkPage checks paging fields: a token is a volume ID, anything else is
// Aborted, as the CSI spec asks.
func checkPage(maxEntries int32, token string) error {
	if maxEntries < 0 {
		return status.Errorf(codes.InvalidArgument, "max_entries: %d is negative", maxEntries)
	}
	if token != "" {
		if _, _, err := volume.ParseVolumeID(token); err != nil {
			return status.Errorf(codes.Aborted, "starting_token %q was not returned by carve: %v", token, err)
		}
	}
	return nil
}

// ControllerGetVolume implements csi.ControllerServer, reading LVM. A volume
// not made yet is NotFound: a move deletes other copies only after an OK.
func (s *ControllerServer) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	lv, err := s.lookup(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if !s.p.Available(lv) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not made yet: it is half-made or its data copy has not finished (tags %v)", req.GetVolumeId(), lv.Tags)
	}
	class, _ := volume.ClassFromTags(lv.Tags)
	return &csi.ControllerGetVolumeResponse{
		Volume: s.volume(lv, class),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

// lookup finds a carve volume by ID: InvalidArgument for an empty ID,
// NotFound for anything not a carve LV of this node's volume groups.
func (s *ControllerServer) lookup(ctx context.Context, id string) (*lvm.LogicalVolume, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	vg, lvName, err := volume.ParseVolumeID(id)
	if err != nil || lvmname.VG(vg) != nil || lvmname.LV(lvName) != nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: not a carve volume ID", id)
	}
	// Peers sharing one device-mapper see each other's volume groups.
	if s.cfg.Classes != nil && !s.cfg.Classes.HasVolumeGroup(vg) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist on node %s: volume group %s is none of its device classes'", id, s.node.name, vg)
	}
	lv, err := s.cfg.LVM.GetLV(ctx, vg, lvName)
	if err != nil {
		return nil, nodestatus.Of(err, "volume "+id)
	}
	if !volume.IsCarve(lv.Tags) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: LV %s is not carve's", id, id)
	}
	return lv, nil
}

// ValidateVolumeCapabilities implements csi.ControllerServer.
func (s *ControllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities: at least one capability must be given")
	}
	lv, err := s.lookup(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if _, err := checkCapabilities(req.GetVolumeCapabilities(), s.cfg.FSTypes); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if len(req.GetParameters()) > 0 {
		class, err := classFromParameters(req.GetParameters(), s.cfg.Classes, s.node.name)
		if err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		if c, _ := volume.ClassFromTags(lv.Tags); c != class.Name {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume is of device class %q, parameters ask for %q", c, class.Name)}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
