package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/state"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/topology"
)

// A snapshot is an LV beside its volume, in the same volume group: a thin
// snapshot (lvcreate --snapshot of a thin LV, in the same pool) for a thin
// class, a copy-on-write snapshot for a thick one. Its identity is in its
// name and tags alone (pkg/volume), so no state outside LVM is kept. A thin
// snapshot keeps LVM's activation-skip flag: it takes no device until a
// restore needs it.

// CreateSnapshot implements csi.ControllerServer. It is idempotent by
// snapshot name: the same name and source is the same snapshot, the same
// name with another source is AlreadyExists.
func (s *ControllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (resp *csi.CreateSnapshotResponse, err error) {
	start := time.Now()
	classLabel := unknownClassLabel
	defer func() { s.cfg.Metrics.ObservePhase(metrics.PhaseSnapshot, classLabel, time.Since(start), err) }()

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
	if !s.node.Accepts(req.GetAccessibilityRequirements()) {
		// carve does not advertise SNAPSHOT_ACCESSIBILITY_CONSTRAINTS, so
		// a CO should not send these; one that does is told why they
		// cannot be met.
		return nil, status.Errorf(codes.InvalidArgument, "accessibility_requirements: a snapshot lives on its volume's node, %s=%s, which the requisite topology does not include", topology.Key, s.node.Name())
	}
	vg, origin, perr := volume.ParseVolumeID(srcID)
	if perr != nil {
		return nil, status.Errorf(codes.NotFound, "source_volume_id %q: not a carve volume: %v", srcID, perr)
	}
	snapLV := volume.SnapshotLVNameFor(name)
	unlock, err := s.lock(snapLV, "snapshot "+name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	log := klog.FromContext(ctx).WithValues("snapshot", name, "lv", snapLV, "sourceVolumeID", srcID)

	if existing, ok := s.findSnapshotLV(vg, snapLV); ok {
		if err := snapshotCompatible(&existing, name, vg, origin); err != nil {
			return nil, err
		}
		c, _ := volume.ClassFromTags(existing.Tags)
		classLabel = c
		log.V(2).Info("Snapshot exists already")
		return &csi.CreateSnapshotResponse{Snapshot: s.snapshot(&existing)}, nil
	}
	src, err := s.sourceLV(ctx, vg, origin, srcID)
	if err != nil {
		return nil, err
	}
	className, _ := volume.ClassFromTags(src.Tags)
	classLabel = className
	class, ok := s.cfg.Classes.Class(className)
	if !ok || class.VolumeGroup != vg {
		return nil, status.Errorf(codes.FailedPrecondition, "source volume %s is of device class %q, which node %s does not configure in volume group %s now", srcID, className, s.node.Name(), vg)
	}
	if class.Thin() != (src.Attr.Type == lvm.TypeThin) {
		return nil, status.Errorf(codes.FailedPrecondition, "source volume %s is a %s LV, its device class %s is not; carve snapshots only volumes it made", srcID, src.Attr.Type, class.Name)
	}

	unlockRoom, err := s.cfg.View.LockRoom(ctx, vg)
	if err != nil {
		return nil, toStatus(err, "snapshot "+name)
	}
	defer unlockRoom()
	sreq := lvm.SnapshotRequest{VolumeGroup: vg, Origin: origin, Name: snapLV,
		Tags: volume.SnapshotTags(name, class.Name, origin), ActivationSkip: true, OriginLV: src}
	if err := s.snapshotRoom(class, src, &sreq); err != nil {
		return nil, err
	}
	if asked, made, ok := volume.AskedFromTags(src.Tags); ok && src.Size == made {
		// Not grown since it was made: the snapshot reports what its
		// claim asked (see snapshotSizeBytes).
		sreq.Tags = append(sreq.Tags, volume.AskedTag(asked, made))
	}
	stepStart := time.Now()
	lv, err := s.cfg.LVM.CreateSnapshot(ctx, sreq)
	s.cfg.Metrics.ObserveStep(metrics.PhaseSnapshot, metrics.StepLVCreate, class.Name, time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrAlreadyExists):
		got, gerr := s.cfg.LVM.GetLV(ctx, vg, snapLV)
		if gerr != nil {
			return nil, toStatus(gerr, "looking up existing snapshot LV "+vg+"/"+snapLV)
		}
		if err := snapshotCompatible(got, name, vg, origin); err != nil {
			return nil, err
		}
		s.cfg.View.Created(*got)
		return &csi.CreateSnapshotResponse{Snapshot: s.snapshot(got)}, nil
	case errors.Is(err, lvm.ErrInsufficientSpace):
		s.refreshAfter(ctx, "an out-of-space snapshot")
		return nil, status.Errorf(codes.ResourceExhausted, "snapshot %q of %s: %v", name, srcID, err)
	case err != nil:
		return nil, toStatus(err, "creating snapshot LV "+vg+"/"+snapLV)
	}
	s.cfg.View.Created(*lv)
	log.Info("Created snapshot", "cowSize", sreq.CowSize)
	return &csi.CreateSnapshotResponse{Snapshot: s.snapshot(lv)}, nil
}

// snapshotRoom checks that class has room for a snapshot of src and sizes
// a copy-on-write one: a thin snapshot adds src's size to the pool's
// virtual size, so it counts against the overprovision ratio like a
// volume; a copy-on-write snapshot takes its copy-on-write space from the
// volume group.
func (s *ControllerServer) snapshotRoom(class *config.DeviceClass, src *lvm.LogicalVolume, sreq *lvm.SnapshotRequest) error {
	room, err := s.cfg.View.Capacity(class)
	if errors.Is(err, state.ErrClassUnavailable) {
		return status.Errorf(codes.Unavailable, "device class %s on node %s cannot take snapshots now: %v", class.Name, s.node.Name(), err)
	}
	if err != nil {
		return toStatus(err, "device class "+class.Name)
	}
	need := src.Size
	if !class.Thin() {
		sreq.CowSize = state.RoundUp(class.SnapshotCowSize(src.Size), room.ExtentSize)
		sreq.Tags = append(sreq.Tags, volume.SizeTag(src.Size))
		need = sreq.CowSize
	}
	if need > room.Available {
		return status.Errorf(codes.ResourceExhausted, "device class %s on node %s has %d bytes available (after a spare of %d); a snapshot of %s needs %d",
			class.Name, s.node.Name(), room.Available, class.SpareBytes(), volume.VolumeID(src.VolumeGroup, src.Name), need)
	}
	return nil
}

// refreshAfter re-reads LVM after a mutation found less room than the
// view, so that the capacity published next is true.
func (s *ControllerServer) refreshAfter(ctx context.Context, what string) {
	if err := s.cfg.View.Refresh(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Refreshing the volume-group view failed", "after", what)
	}
}

// checkSnapshotParameters accepts what csi-snapshotter adds
// (csi.storage.k8s.io/volumesnapshot/name, ... with
// --extra-create-metadata) and nothing else: carve has no snapshot
// parameters of its own; a thick snapshot's size is the device class's.
func checkSnapshotParameters(params map[string]string) error {
	for k := range params {
		if !strings.HasPrefix(k, paramPassThroughPrefix) {
			return status.Errorf(codes.InvalidArgument, "parameters: unknown key %q; carve takes no snapshot parameters (keys starting with %q are accepted and ignored)", k, paramPassThroughPrefix)
		}
	}
	return nil
}

// findSnapshotLV looks for a snapshot LV in the view, in vg first.
func (s *ControllerServer) findSnapshotLV(vg, name string) (lvm.LogicalVolume, bool) {
	if lv, ok := s.cfg.View.LV(vg, name); ok {
		return lv, true
	}
	return s.cfg.View.FindLV(name)
}

// sourceLV finds a carve volume that a snapshot or clone is taken of:
// NotFound when it does not exist on this node.
func (s *ControllerServer) sourceLV(ctx context.Context, vg, name, id string) (*lvm.LogicalVolume, error) {
	if !s.cfg.Classes.HasVolumeGroup(vg) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist on node %s: volume group %s is none of its device classes'", id, s.node.Name(), vg)
	}
	if lv, ok := s.cfg.View.LV(vg, name); ok {
		if k, _, owned := volume.Owned(lv); owned && k == volume.KindVolume {
			return &lv, nil
		}
	}
	lv, err := s.cfg.LVM.GetLV(ctx, vg, name)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist on node %s", id, s.node.Name())
	}
	if err != nil {
		return nil, toStatus(err, "looking up volume "+id)
	}
	if k, _, owned := volume.Owned(*lv); !owned || k != volume.KindVolume {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist: LV %s/%s is not a carve volume", id, vg, name)
	}
	return lv, nil
}

// snapshotCompatible checks that an existing snapshot LV is the snapshot a
// repeated CreateSnapshot asks for.
func snapshotCompatible(lv *lvm.LogicalVolume, name, vg, origin string) error {
	if !volume.HasSnapshotName(lv.Tags, name) {
		other, _, _ := volume.SnapshotNameFromTags(lv.Tags)
		return status.Errorf(codes.AlreadyExists, "LV %s/%s exists but does not carry snapshot %q in its tags (found %q)", lv.VolumeGroup, lv.Name, name, other)
	}
	if o, _ := volume.OriginFromTags(lv.Tags); o != origin || lv.VolumeGroup != vg {
		return status.Errorf(codes.AlreadyExists, "snapshot %q exists of volume %s; source_volume_id %s asked",
			name, volume.VolumeID(lv.VolumeGroup, o), volume.VolumeID(vg, origin))
	}
	return nil
}

// snapshot describes a snapshot LV as a CSI snapshot. A copy-on-write
// snapshot whose space ran out has lost its content: it is reported not
// ready to use, and no restore reads it.
func (s *ControllerServer) snapshot(lv *lvm.LogicalVolume) *csi.Snapshot {
	origin, _ := volume.OriginFromTags(lv.Tags)
	snap := &csi.Snapshot{
		SizeBytes:      int64(snapshotSizeBytes(s.snapshotSize(lv), lv)),
		SnapshotId:     volume.SnapshotID(s.node.Name(), lv.VolumeGroup, lv.Name),
		SourceVolumeId: volume.VolumeID(lv.VolumeGroup, origin),
		ReadyToUse:     snapshotUsable(lv) == nil,
	}
	if !lv.Time.IsZero() {
		snap.CreationTime = timestamppb.New(lv.Time)
	}
	return snap
}

// snapshotSize is the size of the volume a snapshot holds: a thin
// snapshot's own (virtual) size, a copy-on-write snapshot's origin's, as
// its tag recorded it.
func (s *ControllerServer) snapshotSize(lv *lvm.LogicalVolume) uint64 {
	if lv.Attr.Type != lvm.TypeSnapshot {
		return lv.Size
	}
	if n, ok := volume.SizeFromTags(lv.Tags); ok {
		return n
	}
	return 0
}

// snapshotSizeBytes is a snapshot's size_bytes (a VolumeSnapshot's
// restoreSize): what its volume's request asked when carve made that
// volume bigger (a filesystem's minimum, whole extents), else size, the
// size of the volume it holds. csi-provisioner refuses a restore asked
// smaller than it, so a restore asked at the source claim's size is
// accepted; CreateVolume still makes a volume of at least size bytes from
// it (sourceSize), so no volume made from it is smaller than its data.
func snapshotSizeBytes(size uint64, lv *lvm.LogicalVolume) uint64 {
	if asked, made, ok := volume.AskedFromTags(lv.Tags); ok && made == size {
		return asked
	}
	return size
}

// snapshotUsable is nil when a snapshot's content can be read: not a
// copy-on-write snapshot whose space ran out.
func snapshotUsable(lv *lvm.LogicalVolume) error {
	if lv.Attr.SnapshotInvalid || (lv.Attr.Type == lvm.TypeSnapshot && lv.SnapPercent >= 100) {
		return fmt.Errorf("snapshot LV %s/%s ran out of copy-on-write space (lv_attr %s, %.2f%% used): its content is lost; delete it", lv.VolumeGroup, lv.Name, lv.Attr.Raw, lv.SnapPercent)
	}
	return nil
}

// DeleteSnapshot implements csi.ControllerServer. An ID that is not
// carve's, or a snapshot that is gone, is success. A snapshot of another
// node is FailedPrecondition: its LV cannot be seen from here, so it is not
// known to be gone.
func (s *ControllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (resp *csi.DeleteSnapshotResponse, err error) {
	start := time.Now()
	classLabel := unknownClassLabel
	defer func() {
		s.cfg.Metrics.ObservePhase(metrics.PhaseSnapshotDelete, classLabel, time.Since(start), err)
	}()
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, vg, lvName, perr := volume.ParseSnapshotID(id)
	if perr != nil {
		klog.FromContext(ctx).V(2).Info("DeleteSnapshot of an ID that is not carve's; nothing to do", "snapshotID", id)
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if node != s.node.Name() {
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %s lives on node %s, not on %s; only that node can delete it", id, node, s.node.Name())
	}
	unlock, err := s.lock(lvName, "snapshot "+id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	lv, found, err := s.lvToDelete(ctx, vg, lvName, id)
	if err != nil {
		return nil, err
	}
	if !found {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if k, c, owned := volume.Owned(lv); !owned || k != volume.KindSnapshot {
		return nil, status.Errorf(codes.FailedPrecondition, "LV %s/%s is not a carve snapshot; carve does not remove it", vg, lvName)
	} else {
		classLabel = c
	}
	stepStart := time.Now()
	err = s.cfg.LVM.RemoveLV(ctx, vg, lvName)
	s.cfg.Metrics.ObserveStep(metrics.PhaseSnapshotDelete, metrics.StepLVRemove, classLabel, time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		return nil, vgMissing(id, vg, err)
	case errors.Is(err, lvm.ErrNotFound):
	case errors.Is(err, lvm.ErrInUse):
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %s is in use (a restore or clone is copying from it); retry later: %v", id, err)
	case err != nil:
		return nil, toStatus(err, "removing snapshot "+id)
	}
	s.cfg.View.Removed(vg, lvName)
	klog.FromContext(ctx).Info("Deleted snapshot", "snapshotID", id)
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots implements csi.ControllerServer from the in-memory view,
// sorted by snapshot ID; the token is the last ID of the previous page. A
// copy-on-write snapshot that ran out of space shows as not ready from
// the next refresh of the view on (GetSnapshot and restores read LVM).
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

// GetSnapshot implements csi.ControllerServer; it reads the snapshot from
// LVM, so that ready_to_use is current.
func (s *ControllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	lv, err := s.snapshotByID(ctx, req.GetSnapshotId(), codes.NotFound, false)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: s.snapshot(lv)}, nil
}

// snapshotByID finds a snapshot of this node by ID: InvalidArgument for an
// empty ID, elsewhere (with a message naming the node) for a snapshot of
// another node, NotFound for one that does not exist. It reads LVM, so
// that a copy-on-write snapshot that ran out of space shows; with
// viewFirst, a snapshot the view holds as usable is taken from the view
// (a restore: its copy reads LVM after it, and a thin snapshot cannot run
// out of space).
func (s *ControllerServer) snapshotByID(ctx context.Context, id string, elsewhere codes.Code, viewFirst bool) (*lvm.LogicalVolume, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, vg, lvName, err := volume.ParseSnapshotID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "snapshot %q does not exist: %v", id, err)
	}
	if node != s.node.Name() {
		return nil, status.Errorf(elsewhere, "snapshot %s lives on node %s, not on %s: it can be read only there", id, node, s.node.Name())
	}
	if !s.cfg.Classes.HasVolumeGroup(vg) {
		return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist on node %s: volume group %s is none of its device classes'", id, s.node.Name(), vg)
	}
	if lv, ok := s.cfg.View.LV(vg, lvName); ok && viewFirst && snapshotUsable(&lv) == nil {
		if k, _, owned := volume.Owned(lv); owned && k == volume.KindSnapshot {
			return &lv, nil
		}
	}
	// LVM, not the view: a copy-on-write snapshot can run out of space
	// at any moment, and one that has must not be served.
	lv, err := s.cfg.LVM.GetLV(ctx, vg, lvName)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist on node %s", id, s.node.Name())
	}
	if err != nil {
		return nil, toStatus(err, "looking up snapshot "+id)
	}
	if k, _, owned := volume.Owned(*lv); !owned || k != volume.KindSnapshot {
		return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist on node %s: LV %s/%s is not a carve snapshot", id, s.node.Name(), vg, lvName)
	}
	return lv, nil
}
