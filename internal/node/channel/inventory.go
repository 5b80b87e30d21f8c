package channel

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Inventory implements nodeagentv1.NodeAgentServer. Busy names are read
// first, so that no call falls between the two reads.
func (a *Agent) Inventory(context.Context, *nodeagentv1.InventoryRequest) (*nodeagentv1.InventoryResponse, error) {
	resp := &nodeagentv1.InventoryResponse{}
	if a.cfg.Orphans != nil {
		resp.Busy = a.cfg.Orphans.BusyNames()
	}
	for _, d := range a.cfg.Classes.DeviceClasses {
		resp.DeviceClasses = append(resp.DeviceClasses, &nodeagentv1.DeviceClass{Name: d.Name, VolumeGroup: d.VolumeGroup})
	}
	for _, lv := range a.cfg.Inventory.Volumes() {
		resp.Volumes = append(resp.Volumes, inventoryLV(&lv))
	}
	for _, vg := range a.cfg.Classes.VolumeGroups() {
		if !a.cfg.Inventory.Readable(vg) {
			resp.UnreadableVolumeGroups = append(resp.UnreadableVolumeGroups, vg)
		}
	}
	return resp, nil
}

// QuarantineOrphan implements nodeagentv1.NodeAgentServer, for configured
// volume groups only.
func (a *Agent) QuarantineOrphan(ctx context.Context, req *nodeagentv1.QuarantineOrphanRequest) (*nodeagentv1.QuarantineOrphanResponse, error) {
	vg, name := req.GetVolumeGroup(), req.GetName()
	if err := a.orphanRequest(vg, name); err != nil {
		return nil, err
	}
	if req.GetOrphanedAtUnix() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "orphaned_at_unix: must be set")
	}
	got, err := a.cfg.Orphans.QuarantineOrphan(ctx, vg, name, time.Unix(req.GetOrphanedAtUnix(), 0))
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "quarantining orphaned LV %s: %v", volume.VolumeID(vg, name), err)
	}
	return &nodeagentv1.QuarantineOrphanResponse{Name: got}, nil
}

// RemoveOrphan implements nodeagentv1.NodeAgentServer: only an LV of a
// configured volume group named by its pre-quarantine name.
func (a *Agent) RemoveOrphan(ctx context.Context, req *nodeagentv1.RemoveOrphanRequest) (*nodeagentv1.RemoveOrphanResponse, error) {
	vg, name := req.GetVolumeGroup(), req.GetName()
	if err := a.orphanRequest(vg, name); err != nil {
		return nil, err
	}
	if req.GetOrphanOf() == "" {
		return nil, status.Errorf(codes.InvalidArgument, "orphan_of: must be set; node %s removes only orphans it quarantined first", a.cfg.NodeName)
	}
	if err := a.cfg.Orphans.RemoveOrphan(ctx, vg, name, req.GetOrphanOf()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "removing orphaned LV %s: %v", volume.VolumeID(vg, name), err)
	}
	return &nodeagentv1.RemoveOrphanResponse{}, nil
}

func (a *Agent) orphanRequest(vg, name string) error {
	if !slices.Contains(a.cfg.Classes.VolumeGroups(), vg) {
		return status.Errorf(codes.InvalidArgument, "volume_group %q: not a volume group of node %s's device classes", vg, a.cfg.NodeName)
	}
	if name == "" {
		return status.Error(codes.InvalidArgument, "name: must be set")
	}
	if a.cfg.Orphans == nil {
		return status.Errorf(codes.FailedPrecondition, "node %s removes no orphans", a.cfg.NodeName)
	}
	return nil
}

func inventoryLV(lv *lvm.LogicalVolume) *nodeagentv1.LogicalVolume {
	o := volume.OwnerFromTags(lv.Tags)
	out := &nodeagentv1.LogicalVolume{VolumeGroup: lv.VolumeGroup, Name: lv.Name, SizeBytes: clampInt64(lv.Size),
		DeviceClass: o.Class, VolumeName: o.VolumeName, Claim: o.Claim}
	if q, ok := volume.QuarantinedFrom(lv.Name, lv.Tags); ok {
		out.OrphanOf = q.Original
		if !q.At.IsZero() {
			out.OrphanedAtUnix = q.At.Unix()
		}
	}
	return out
}
