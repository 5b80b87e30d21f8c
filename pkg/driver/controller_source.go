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
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/state"
	"github.com/carve-csi/carve/pkg/volume"
)

// A volume made from a content source (a restore from a snapshot, a clone
// of a volume) is, when the source is a thin LV in the pool of the asked
// class, a writable thin snapshot of it: instant, sharing blocks. Any
// other pairing copies the data into a new LV (blockcopy): the LV is made
// with volume.TagCopyPending, the data is copied and synced, and only
// then is the tag removed and the volume reported made. A clone copies
// from a temporary snapshot of its source, so that the copy is of one
// moment while the source is written. The copy is detached from the
// request's context: csi-provisioner gives up on a long call and retries,
// the retries answer Aborted while the copy runs, and the first retry
// after it finishes finds the volume made.

// copyTimeout bounds a copy that runs detached from its request.
const copyTimeout = 12 * time.Hour

// contentSource is a resolved volume_content_source.
type contentSource struct {
	// lv is the snapshot or volume LV to read.
	lv lvm.LogicalVolume
	// size is the size of the volume it holds.
	size uint64
	// id is the snapshot or volume ID, what names it in messages.
	id string
	// snapshot is true for a snapshot, false for a volume.
	snapshot bool
}

// sourcePhase is the metrics phase of a CreateVolume.
func sourcePhase(cs *csi.VolumeContentSource) string {
	switch {
	case cs.GetSnapshot() != nil:
		return metrics.PhaseRestore
	case cs.GetVolume() != nil:
		return metrics.PhaseClone
	}
	return metrics.PhaseCreate
}

// sourceTags are the tags that record a content source on the volume made
// from it (none without a source).
func sourceTags(cs *csi.VolumeContentSource) ([]string, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		id := cs.GetSnapshot().GetSnapshotId()
		if id == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id: must be set")
		}
		return []string{volume.FromSnapshotTag(id)}, nil
	case cs.GetVolume() != nil:
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source.volume.volume_id: must be set")
		}
		return []string{volume.FromVolumeTag(id)}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "volume_content_source: names neither a snapshot nor a volume")
}

// resolveSource finds the LV of a content source on this node. A source
// of another node is ResourceExhausted naming that node (so that the pod
// is scheduled again): a snapshot ID names its node, a volume's node is
// that of its PersistentVolume (the Locator). A source that exists
// nowhere is NotFound; a copy-on-write snapshot whose space ran out is
// FailedPrecondition.
func (s *ControllerServer) resolveSource(ctx context.Context, cs *csi.VolumeContentSource) (*contentSource, error) {
	if snap := cs.GetSnapshot(); snap != nil {
		lv, err := s.snapshotByID(ctx, snap.GetSnapshotId(), codes.ResourceExhausted, true)
		if err != nil {
			return nil, err
		}
		if err := snapshotUsable(lv); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "volume_content_source: snapshot %s cannot be restored: %v", snap.GetSnapshotId(), err)
		}
		return &contentSource{lv: *lv, size: s.snapshotSize(lv), id: snap.GetSnapshotId(), snapshot: true}, nil
	}
	id := cs.GetVolume().GetVolumeId()
	vg, name, err := volume.ParseVolumeID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume_content_source: volume %q does not exist: %v", id, err)
	}
	lv, err := s.sourceLV(ctx, vg, name, id)
	if status.Code(err) == codes.NotFound {
		return nil, s.sourceElsewhere(id, err)
	}
	if err != nil {
		return nil, err
	}
	if volume.CopyPending(lv.Tags) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume_content_source: volume %s is still being copied into; clone it once it is made", id)
	}
	return &contentSource{lv: *lv, size: lv.Size, id: id}, nil
}

// sourceElsewhere answers for a clone's source volume that is not on this
// node (notHere says why): ResourceExhausted naming the node whose
// PersistentVolume holds it, so that csi-provisioner drops this node and
// the scheduler picks again; NotFound when no other node's PV has it (or
// which node holds it cannot be known: no API access); Unavailable while
// the PV cache is not filled yet.
func (s *ControllerServer) sourceElsewhere(id string, notHere error) error {
	msg := status.Convert(notHere).Message()
	if s.cfg.Locator == nil {
		return status.Errorf(codes.NotFound, "volume_content_source: %s (which node holds it is not known here: the plugin runs without API access, --audit-interval=0)", msg)
	}
	nodes, err := s.cfg.Locator.NodesOf(id)
	if err != nil {
		return status.Errorf(codes.Unavailable, "volume_content_source: %s, and which node holds it is not known yet: %v; retry later", msg, err)
	}
	var others []string
	for _, n := range nodes {
		if n != "" && n != s.node.Name() {
			others = append(others, n)
		}
	}
	if len(others) == 0 {
		return status.Errorf(codes.NotFound, "volume_content_source: %s, nor on any other node (no PersistentVolume of another node has it)", msg)
	}
	return status.Errorf(codes.ResourceExhausted, "volume_content_source: volume %s lives on node %s, not on %s: a clone is made on its source's node only; "+
		"the pod is scheduled again (pin it to %s: see docs/backup-restore.md)", id, strings.Join(others, ", "), s.node.Name(), others[0])
}

// sourceSize is the size of a volume made from a source of srcSize bytes
// when size was asked: at least the source's, rounded to unit, within the
// limit.
func sourceSize(size, srcSize, unit uint64, r *csi.CapacityRange) (uint64, error) {
	if size >= srcSize {
		return size, nil
	}
	size = state.RoundUp(srcSize, unit)
	if lim := r.GetLimitBytes(); lim > 0 && size > uint64(lim) {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is smaller than the content source's %d bytes", lim, srcSize)
	}
	return size, nil
}

// thinInto tells whether a source can become a volume of class as a thin
// snapshot: a thin LV in the class's pool.
func (src *contentSource) thinInto(class *config.DeviceClass) bool {
	return class.Thin() && src.lv.Attr.Type == lvm.TypeThin && src.lv.VolumeGroup == class.VolumeGroup && src.lv.Pool == class.ThinPool
}

// sourceTag is the tag of a volume made from src.
func (src *contentSource) sourceTag() string {
	if src.snapshot {
		return volume.FromSnapshotTag(src.id)
	}
	return volume.FromVolumeTag(src.id)
}

// makeFromSource makes the LV of c from its source, of size bytes: a thin
// snapshot of the source (grown to size) when the source is a thin LV of
// the class's pool, else an empty LV carrying volume.TagCopyPending, which
// the caller fills (copyInto) outside the room lock. The caller holds the
// volume's lock and the room lock and has checked the room for size bytes.
func (s *ControllerServer) makeFromSource(ctx context.Context, c *createCall, size uint64) (*lvm.LogicalVolume, error) {
	class, src, lvName := c.class, c.src, c.lvName
	log := klog.FromContext(ctx).WithValues("volume", c.req.GetName(), "lv", lvName, "source", src.id)
	tags := append(volume.VolumeTags(c.req.GetName(), class.Name, c.req.GetParameters()), src.sourceTag())
	tags = append(tags, askedTags(c.req.GetCapacityRange(), size)...)
	var lv *lvm.LogicalVolume
	var err error
	t := time.Now()
	if src.thinInto(class) {
		lv, err = s.cfg.LVM.CreateSnapshot(ctx, lvm.SnapshotRequest{VolumeGroup: class.VolumeGroup, Origin: src.lv.Name, Name: lvName, Tags: tags, OriginLV: &src.lv})
	} else {
		creq := lvm.CreateRequest{VolumeGroup: class.VolumeGroup, Name: lvName, Size: size, Tags: append(tags, volume.TagCopyPending)}
		if class.Thin() {
			creq.ThinPool = class.ThinPool
		} else {
			creq.Options = class.LVCreateOptions
		}
		lv, err = s.cfg.LVM.CreateLV(ctx, creq)
	}
	s.cfg.Metrics.ObserveStep(c.phase, metrics.StepLVCreate, class.Name, time.Since(t), err)
	if errors.Is(err, lvm.ErrAlreadyExists) {
		// The view missed it: ask LVM and treat it as a repeat.
		got, gerr := s.cfg.LVM.GetLV(ctx, class.VolumeGroup, lvName)
		if gerr != nil {
			return nil, toStatus(gerr, "looking up existing LV "+volume.VolumeID(class.VolumeGroup, lvName))
		}
		s.cfg.View.Created(*got)
		lv, _, err := s.existingFromSource(ctx, got, c, size)
		return lv, err
	}
	if err != nil {
		if errors.Is(err, lvm.ErrInsufficientSpace) {
			s.refreshAfter(ctx, "an out-of-space lvcreate")
		}
		return nil, toStatus(err, "creating LV "+volume.VolumeID(class.VolumeGroup, lvName))
	}
	s.cfg.View.Created(*lv)
	if src.thinInto(class) {
		if lv, err = s.grow(ctx, lv, size, class, c.phase); err != nil {
			return nil, err
		}
		log.Info("Created volume as a thin snapshot of its source", "size", lv.Size)
	} else {
		log.Info("Created volume to copy its source into", "size", lv.Size)
	}
	return lv, nil
}

// existingFromSource answers for an LV made from a source before: a thin
// one is grown to size if a crash came before its growth; one whose copy
// did not finish is returned for the caller to copy again.
func (s *ControllerServer) existingFromSource(ctx context.Context, lv *lvm.LogicalVolume, c *createCall, size uint64) (*lvm.LogicalVolume, bool, error) {
	if err := s.sameVolume(lv, c.req, c.class, c.wantSource); err != nil {
		return nil, false, err
	}
	if volume.CopyPending(lv.Tags) {
		klog.FromContext(ctx).Info("Volume exists with an unfinished copy; copying again", "volume", c.req.GetName(), "source", c.src.id)
		return lv, false, nil
	}
	lv, err := s.grow(ctx, lv, size, c.class, c.phase)
	if err != nil {
		return nil, false, err
	}
	if err := s.compatible(lv, c.req, c.class, c.wantSource); err != nil {
		return nil, false, err
	}
	return lv, false, nil
}

// grow extends a thin volume made from a smaller source to size bytes.
func (s *ControllerServer) grow(ctx context.Context, lv *lvm.LogicalVolume, size uint64, class *config.DeviceClass, phase string) (*lvm.LogicalVolume, error) {
	if lv.Size >= size {
		return lv, nil
	}
	t := time.Now()
	got, err := s.cfg.LVM.ExtendLV(ctx, lv.VolumeGroup, lv.Name, size)
	s.cfg.Metrics.ObserveStep(phase, metrics.StepLVExtend, class.Name, time.Since(t), err)
	if err != nil {
		return nil, toStatus(err, fmt.Sprintf("growing %s to %d bytes", volume.VolumeID(lv.VolumeGroup, lv.Name), size))
	}
	s.cfg.View.Extended(*lv, *got)
	return got, nil
}

// copyInto copies src's data into the new LV dst (which carries
// TagCopyPending), then removes the tag. A clone reads a temporary
// snapshot of its source, removed afterwards. The copy runs detached from
// the request (see above) and is redone from the start when retried.
func (s *ControllerServer) copyInto(ctx context.Context, dst *lvm.LogicalVolume, class *config.DeviceClass, src *contentSource, phase string) (*lvm.LogicalVolume, error) {
	if s.cfg.Copier == nil {
		return nil, status.Error(codes.Internal, "no copier configured")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
	defer cancel()
	log := klog.FromContext(ctx).WithValues("lv", dst.Name, "source", src.id)

	from := src.lv
	var tmp string
	if !src.snapshot {
		var err error
		if from, err = s.copySource(ctx, dst.Name, class, &src.lv); err != nil {
			return nil, err
		}
		tmp = from.Name
		// Done or failed, the copy needs it no more: a retry takes a new
		// one, of the source as it is then.
		defer s.removeCopySource(ctx, dst.VolumeGroup, tmp)
	}
	read, err := s.copyDevice(ctx, &from, "source")
	if err != nil {
		return nil, err
	}
	if err := snapshotUsable(read); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "source %s: %v", src.id, err)
	}
	write, err := s.copyDevice(ctx, dst, "target")
	if err != nil {
		return nil, err
	}
	t := time.Now()
	var copied uint64
	res, err := s.cfg.Copier.Copy(ctx, lvDevicePath(write), lvDevicePath(read), src.size, func(n uint64) {
		s.cfg.Metrics.AddCopiedBytes(phase, class.Name, n-copied)
		copied = n
	})
	s.cfg.Metrics.ObserveStep(phase, metrics.StepCopy, class.Name, time.Since(t), err)
	// A copy-on-write source that ran out of space during the copy (or
	// before it: the view the source was found in may be older) was read
	// half old, half lost, or not at all. The copy is then not used, and
	// stays unfinished.
	unusable, aerr := s.sourceSpent(ctx, read)
	if aerr == nil && unusable != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "source %s ran out of its snapshot space; the copy into %s is not used: %v", src.id, dst.Name, unusable)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "copying %s into %s (%d of %d bytes done; a retry copies again): %v", src.id, dst.Name, res.Bytes, src.size, err)
	}
	if aerr != nil {
		return nil, toStatus(aerr, "reading the copy's source "+from.VolumeGroup+"/"+from.Name+" after the copy")
	}
	// The copy is synced: it is whole whatever happens next. The tag goes
	// first, the temporary snapshot after (one left by a crash is removed
	// by the retry or by DeleteVolume).
	if err := s.cfg.LVM.DeleteTags(ctx, dst.VolumeGroup, dst.Name, volume.TagCopyPending); err != nil {
		return nil, toStatus(err, "marking the copy into "+dst.Name+" finished")
	}
	done := *write
	done.Tags = withoutTag(write.Tags, volume.TagCopyPending)
	s.cfg.View.Created(done)
	log.Info("Copied the volume's data", "bytes", res.Bytes, "duration", res.Duration)
	return &done, nil
}

// sourceSpent tells, after a copy from lv, whether lv ran out of its
// copy-on-write space (unusable says how), or err when that cannot be
// read. Only a copy-on-write snapshot can; its state comes from the
// kernel (no lvm command), or from LVM when the kernel's cannot be read.
func (s *ControllerServer) sourceSpent(ctx context.Context, lv *lvm.LogicalVolume) (unusable, err error) {
	if lv.Attr.Type != lvm.TypeSnapshot {
		return nil, nil
	}
	if s.cfg.Snapshots != nil {
		st, err := s.cfg.Snapshots.Read(lvDevicePath(lv))
		switch {
		case err == nil && st.Snapshot && st.Invalid:
			return fmt.Errorf("snapshot LV %s/%s ran out of copy-on-write space (device-mapper status %q): its content is lost; delete it", lv.VolumeGroup, lv.Name, st.Status), nil
		case err == nil && st.Snapshot:
			return nil, nil
		case err == nil:
			err = fmt.Errorf("the device is not a device-mapper snapshot (status %q)", st.Status)
		}
		klog.FromContext(ctx).V(2).Info("Reading a snapshot's state from device-mapper failed; asking LVM", "lv", lv.VolumeGroup+"/"+lv.Name, "err", err)
	}
	after, err := s.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return nil, err
	}
	return snapshotUsable(after), nil
}

// copyDevice returns an LV of a copy with its device node: an active LV
// has one, so the common case asks LVM nothing; an LV without one (after
// a reboot, or a snapshot made with the activation-skip flag) is
// activated.
func (s *ControllerServer) copyDevice(ctx context.Context, lv *lvm.LogicalVolume, what string) (*lvm.LogicalVolume, error) {
	if s.isDeviceNode(lvDevicePath(lv)) {
		return lv, nil
	}
	got, err := s.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return nil, toStatus(err, "activating the copy's "+what+" "+lv.VolumeGroup+"/"+lv.Name)
	}
	return got, nil
}

// copySource makes (again, if a crashed try left one) the temporary
// snapshot of a clone's source volume.
func (s *ControllerServer) copySource(ctx context.Context, target string, class *config.DeviceClass, src *lvm.LogicalVolume) (lvm.LogicalVolume, error) {
	name := volume.CopySourceLVNameFor(target)
	// A snapshot left by an earlier try is of an older moment: make it
	// anew, so that the clone is of the source as it is now.
	s.removeCopySource(ctx, src.VolumeGroup, name)
	req := lvm.SnapshotRequest{VolumeGroup: src.VolumeGroup, Origin: src.Name, Name: name, Tags: volume.CopySourceTags(target, class.Name), OriginLV: src}
	if src.Attr.Type != lvm.TypeThin {
		srcClass := class
		if c, ok := volume.ClassFromTags(src.Tags); ok {
			if d, ok := s.cfg.Classes.Class(c); ok {
				srcClass = d
			}
		}
		room, err := s.cfg.View.Capacity(srcClass)
		if err != nil {
			return lvm.LogicalVolume{}, toStatus(err, "room for the temporary snapshot of "+src.Name)
		}
		req.CowSize = state.RoundUp(srcClass.SnapshotCowSize(src.Size), room.ExtentSize)
	}
	lv, err := s.cfg.LVM.CreateSnapshot(ctx, req)
	if err != nil {
		return lvm.LogicalVolume{}, toStatus(err, "creating the temporary snapshot "+name+" of "+src.Name)
	}
	s.cfg.View.Created(*lv)
	return *lv, nil
}

// removeCopySource removes a temporary snapshot if it is there; a failure
// is logged, not returned: the copy it served is whole.
func (s *ControllerServer) removeCopySource(ctx context.Context, vg, name string) {
	lv, ok := s.cfg.View.LV(vg, name)
	if !ok {
		return
	}
	if k, _, owned := volume.Owned(lv); !owned || k != volume.KindCopySource {
		return
	}
	err := s.cfg.LVM.RemoveLV(ctx, vg, name)
	if err != nil && !errors.Is(err, lvm.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "Removing a clone's temporary snapshot failed; it is removed with its volume", "lv", vg+"/"+name)
		return
	}
	s.cfg.View.Removed(vg, name)
}

func withoutTag(tags []string, tag string) []string {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if t != tag {
			out = append(out, t)
		}
	}
	return out
}
