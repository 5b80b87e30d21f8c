package nodeagent

import (
	"context"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/volume"
)

// Inventory implements nodeagentv1.NodeAgentServer: carve's volumes in the
// configured volume groups with their tags read, and the volume groups
// whose listing is not fresh (their volumes are unknown, not absent).
func (a *Agent) Inventory(context.Context, *nodeagentv1.InventoryRequest) (*nodeagentv1.InventoryResponse, error) {
	resp := &nodeagentv1.InventoryResponse{}
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

// inventoryLV reads lv's tags as the node's audit does.
func inventoryLV(lv *lvm.LogicalVolume) *nodeagentv1.LogicalVolume {
	o := volume.OwnerFromTags(lv.Tags)
	return &nodeagentv1.LogicalVolume{VolumeGroup: lv.VolumeGroup, Name: lv.Name, SizeBytes: clampInt64(lv.Size),
		DeviceClass: o.Class, VolumeName: o.VolumeName, Claim: o.Claim}
}
