package driver

import (
	"context"
	"errors"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// CreateSnapshot implements csi.ControllerServer, idempotent by name: the
// same name with another source is AlreadyExists.
func (s *ControllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (resp *csi.CreateSnapshotResponse, err error) {
	op := s.cfg.Metrics.Begin(metrics.PhaseSnapshot, csiserver.ResultOf)
	defer op.End(&err)

	name, srcID := req.GetName(), req.GetSourceVolumeId()
	if err := checkVolumeName(name); err != nil {
		return nil, err
	}
	if srcID == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id: must be set")
	}
	if err := checkSnapshotParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	if !s.node.accepts(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.InvalidArgument, "accessibility_requirements: a snapshot lives on its volume's node, %s=%s, which the requisite topology does not include", topology.Key, s.node.name)
	}
	vg, origin, perr := volume.ParseVolumeID(srcID)
	if perr != nil {
		return nil, status.Errorf(codes.NotFound, "source_volume_id %q: not a carve volume: %v", srcID, perr)
	}
	lv, class, err := s.p.Snapshot(ctx, provision.SnapshotRequest{Name: name, SourceID: srcID, VolumeGroup: vg, Origin: origin})
	op.SetClass(class)
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	return &csi.CreateSnapshotResponse{Snapshot: s.snapshot(lv)}, nil
}

// checkSnapshotParameters accepts only what csi-snapshotter adds with
// --extra-create-metadata: carve has no snapshot parameters.
func checkSnapshotParameters(params map[string]string) error {
	for k := range params {
		if !strings.HasPrefix(k, paramPassThroughPrefix) {
			return status.Errorf(codes.InvalidArgument, "parameters: unknown key %q; carve takes no snapshot parameters (keys starting with %q are accepted and ignored)", k, paramPassThroughPrefix)
		}
	}
	return nil
}

// snapshot describes a snapshot LV. A copy-on-write snapshot that ran out of
// space has lost its content: it is not ready to use.
func (s *ControllerServer) snapshot(lv *lvm.LogicalVolume) *csi.Snapshot {
	origin, _ := volume.OriginFromTags(lv.Tags)
	snap := &csi.Snapshot{
		SizeBytes:      int64(provision.SnapshotSizeBytes(provision.SnapshotSize(lv), lv)),
		SnapshotId:     volume.SnapshotID(s.node.name, lv.VolumeGroup, lv.Name),
		SourceVolumeId: volume.VolumeID(lv.VolumeGroup, origin),
		ReadyToUse:     provision.SnapshotUsable(lv) == nil,
	}
	if !lv.Time.IsZero() {
		snap.CreationTime = timestamppb.New(lv.Time)
	}
	return snap
}

// DeleteSnapshot implements csi.ControllerServer. Another node's snapshot is
// FailedPrecondition: it cannot be seen to be gone.
func (s *ControllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (resp *csi.DeleteSnapshotResponse, err error) {
	op := s.cfg.Metrics.Begin(metrics.PhaseSnapshotDelete, csiserver.ResultOf)
	defer op.End(&err)
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, vg, lvName, perr := volume.ParseSnapshotID(id)
	if perr != nil {
		klog.FromContext(ctx).V(2).Info("DeleteSnapshot of an ID that is not carve's; nothing to do", "snapshotID", id)
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if node != s.node.name {
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %s lives on node %s, not on %s; only that node can delete it", id, node, s.node.name)
	}
	class, err := s.p.DeleteSnapshot(ctx, vg, lvName, id)
	op.SetClass(class)
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots implements csi.ControllerServer from the view, sorted by ID,
// paged like ListVolumes.
func (s *ControllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	token := req.GetStartingToken()
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries: %d is negative", req.GetMaxEntries())
	}
	if token != "" {
		if _, _, _, err := volume.ParseSnapshotID(token); err != nil {
			return nil, status.Errorf(codes.Aborted, "starting_token %q was not returned by carve: %v", token, err)
		}
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, lv := range s.cfg.View.Snapshots() {
		snap := s.snapshot(&lv)
		if id := req.GetSnapshotId(); id != "" && snap.GetSnapshotId() != id {
			continue
		}
		if src := req.GetSourceVolumeId(); src != "" && snap.GetSourceVolumeId() != src {
			continue
		}
		if token != "" && snap.GetSnapshotId() <= token {
			continue
		}
		if limit := int(req.GetMaxEntries()); limit > 0 && len(resp.Entries) == limit {
			resp.NextToken = resp.Entries[limit-1].GetSnapshot().GetSnapshotId()
			break
		}
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: snap})
	}
	return resp, nil
}

// GetSnapshot implements csi.ControllerServer, reading LVM so that
// ready_to_use is current. Another node's snapshot is NotFound.
func (s *ControllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	lv, err := s.p.SnapshotByID(ctx, req.GetSnapshotId(), false)
	if errors.Is(err, provision.ErrElsewhere) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	return &csi.GetSnapshotResponse{Snapshot: s.snapshot(lv)}, nil
}
