package nodeagent

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/volume"
)

// Inventory implements nodeagentv1.NodeAgentServer: carve's volumes in the
// configured volume groups with their tags read, the volume groups whose
// listing is not fresh (their volumes are unknown, not absent), the
// device classes, and the LV names with a call in flight. The names in
// flight are read first: a call that starts after the listing is caught
// by the next inventory, and one that ended before it shows in it.
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

// RemoveOrphan implements nodeagentv1.NodeAgentServer: the controller's
// audit removes an orphan (--remove-orphans) through it. Only an LV of a
// configured volume group can be named.
func (a *Agent) RemoveOrphan(ctx context.Context, req *nodeagentv1.RemoveOrphanRequest) (*nodeagentv1.RemoveOrphanResponse, error) {
	vg, name := req.GetVolumeGroup(), req.GetName()
	if !slices.Contains(a.cfg.Classes.VolumeGroups(), vg) {
		return nil, status.Errorf(codes.InvalidArgument, "volume_group %q: not a volume group of node %s's device classes", vg, a.cfg.NodeName)
	}
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name: must be set")
	}
	if a.cfg.Orphans == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s removes no orphans", a.cfg.NodeName)
	}
	if err := a.cfg.Orphans.RemoveOrphan(ctx, vg, name); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "removing orphaned LV %s: %v", volume.VolumeID(vg, name), err)
	}
	return &nodeagentv1.RemoveOrphanResponse{}, nil
}

// inventoryLV reads lv's tags as the node's audit does.
func inventoryLV(lv *lvm.LogicalVolume) *nodeagentv1.LogicalVolume {
	o := volume.OwnerFromTags(lv.Tags)
	return &nodeagentv1.LogicalVolume{VolumeGroup: lv.VolumeGroup, Name: lv.Name, SizeBytes: clampInt64(lv.Size),
		DeviceClass: o.Class, VolumeName: o.VolumeName, Claim: o.Claim}
}
