package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// CSI 1.13 health entries replace VolumeCondition; an empty list is healthy.

// thinPoolFullPercent is the pool use at which thin volumes are DEGRADED:
// writes to unallocated blocks fail soon.
const thinPoolFullPercent = 95

func volumeHealth(id string, lv *lvm.LogicalVolume, pool *lvm.ThinPool) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: id}
	add := func(t csi.VolumeHealthErrorType, reason, format string, args ...any) {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: t, Reason: reason, Message: fmt.Sprintf(format, args...) + fmt.Sprintf(" (lv_attr %s)", lv.Attr.Raw)})
	}
	a := lv.Attr
	switch a.Health {
	case lvm.HealthOK, "":
	case lvm.HealthPartial:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, "PhysicalVolumeMissing", "a physical volume of the LV is missing")
	case lvm.HealthFailed:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, "LogicalVolumeFailed", "LVM reports the LV as failed")
	case lvm.HealthRefreshNeeded, lvm.HealthMismatchesExist, lvm.HealthMetadataReadOnly, lvm.HealthOutOfData:
		add(csi.VolumeHealthErrorType_DEGRADED, "LogicalVolumeDegraded", "LVM reports the LV as %s", a.Health)
	case lvm.HealthWriteMostly, lvm.HealthReshaping:
	default:
		add(csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE, "LogicalVolumeHealthUnknown", "LVM reports the LV's health as %s", a.Health)
	}
	if !a.Active {
		add(csi.VolumeHealthErrorType_INACCESSIBLE, "LogicalVolumeInactive", "the LV is not active, so it has no device node")
	}
	if pool != nil && (pool.DataPercent >= thinPoolFullPercent || pool.MetadataPercent >= thinPoolFullPercent) {
		add(csi.VolumeHealthErrorType_DEGRADED, "ThinPoolFull", "thin pool %s is %.1f%% full (data) and %.1f%% (metadata)", pool.Name, pool.DataPercent, pool.MetadataPercent)
	}
	return h
}

// ControllerGetVolumeHealth implements csi.ControllerServer, reading LVM.
func (s *ControllerServer) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	lv, err := s.lookup(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(req.GetVolumeId(), lv, s.poolOf(lv))}, nil
}

func (s *ControllerServer) poolOf(lv *lvm.LogicalVolume) *lvm.ThinPool {
	if lv.Pool == "" {
		return nil
	}
	if p, ok := s.cfg.View.Pool(lv.VolumeGroup, lv.Pool); ok {
		return &p
	}
	return nil
}

// ControllerListVolumeHealth implements csi.ControllerServer: available
// volumes with a health problem, from the view, paged like ListVolumes.
func (s *ControllerServer) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	token := req.GetStartingToken()
	if err := checkPage(req.GetMaxEntries(), token); err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{}
	for _, lv := range s.cfg.View.Volumes() {
		id := volume.VolumeID(lv.VolumeGroup, lv.Name)
		if (token != "" && id <= token) || !s.p.Available(&lv) {
			continue
		}
		h := volumeHealth(id, &lv, s.poolOf(&lv))
		if len(h.HealthStatuses) == 0 {
			continue
		}
		if limit := int(req.GetMaxEntries()); limit > 0 && len(resp.Entries) == limit {
			resp.NextToken = resp.Entries[limit-1].GetVolumeId()
			break
		}
		resp.Entries = append(resp.Entries, h)
	}
	return resp, nil
}
