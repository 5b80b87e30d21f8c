package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/dmsnapshot"
	"github.com/carve-csi/carve/pkg/erase"
	"github.com/carve-csi/carve/pkg/jobs"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/state"
	"github.com/carve-csi/carve/pkg/unfinished"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/pkg/volumelock"
	"github.com/carve-csi/carve/topology"
)

// ControllerConfig holds what the Controller server needs; main builds it.
type ControllerConfig struct {
	// NodeName is this node; the controller acts on its volume groups only.
	NodeName string
	// Classes is the device-class file.
	Classes *config.Config
	// LVM runs the mutations.
	LVM LVM
	// View is the in-memory state the reads are served from; it must have
	// been refreshed once.
	View *state.View
	// FSTypes are the filesystems this node can make (ext4 and xfs, btrfs
	// when mkfs.btrfs was found at start-up).
	FSTypes []string
	// Metrics records phases and steps; nil records nothing.
	Metrics *metrics.Recorder
	// Eraser zeroes new raw-block volumes; nil is erase.Devices.
	Eraser erase.Eraser
	// Copier copies the data of a restore or clone that is not a thin
	// snapshot in the class's own pool.
	Copier Copier
	// Snapshots reads a copy-on-write snapshot's state from the kernel
	// after a copy from it; nil asks LVM (one lvs more).
	Snapshots SnapshotReader
	// Locator finds the node of a clone's source volume that is not on
	// this node; nil (no API access) leaves it unknown.
	Locator Locator
	// Marks records the thick LVs being made until they are ready; it
	// must be set.
	Marks *unfinished.Marks
	// Formatting is the node server's (NodeConfig): a volume made or
	// deleted has its mark taken off, so that no mark left by an older LV
	// of the same name has a stage erase a new one; nil when the node
	// server has none.
	Formatting *unfinished.Marks
}

// SnapshotReader reads the state of a device-mapper device at a path
// (dmsnapshot.Reader).
type SnapshotReader interface {
	Read(path string) (dmsnapshot.State, error)
}

// Locator tells where volumes are: a volume ID does not name its node.
type Locator interface {
	// NodesOf returns the nodes, sorted, whose PersistentVolumes carry
	// the volume ID as their handle; none when no PV does; an error when
	// it cannot be known now (and may be later).
	NodesOf(volumeID string) ([]string, error)
}

// ControllerServer implements csi.ControllerServer for this node's volume
// groups.
type ControllerServer struct {
	csi.UnimplementedControllerServer
	cfg   ControllerConfig
	node  topology.Node
	locks *volumelock.Locks
	// finishing zeroes and marks finished the new LVs, keyed by LV name,
	// beyond the life of one call (erasing a large volume takes longer
	// than csi-provisioner's deadline); the retries join it. An ended
	// finishing is not kept: a retry reads the outcome from the LV's tags.
	finishing jobs.Set[*lvm.LogicalVolume]
	// isDeviceNode tells whether path is a block device node; tests
	// replace it.
	isDeviceNode func(path string) bool
}

var _ csi.ControllerServer = (*ControllerServer)(nil)

// NewControllerServer returns the Controller server of cfg.
func NewControllerServer(cfg ControllerConfig) *ControllerServer {
	if cfg.Eraser == nil {
		cfg.Eraser = erase.Devices{}
	}
	return &ControllerServer{cfg: cfg, node: topology.ForNode(cfg.NodeName), locks: volumelock.New(), isDeviceNode: isBlockDevice}
}

// controllerCaps are the capabilities carve's controller advertises.
var controllerCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
}

func controllerCapabilities(types []csi.ControllerServiceCapability_RPC_Type) *csi.ControllerGetCapabilitiesResponse {
	caps := make([]*csi.ControllerServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}
}

// ControllerGetCapabilities implements csi.ControllerServer.
func (s *ControllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return controllerCapabilities(controllerCaps), nil
}

// lock takes the per-volume lock of an LV name; busy is Aborted.
func (s *ControllerServer) lock(lvName, what string) (func(), error) {
	if !s.locks.TryAcquire(lvName) {
		return nil, status.Errorf(codes.Aborted, "an operation on %s is already in progress; retry later", what)
	}
	return func() { s.locks.Release(lvName) }, nil
}

// unknownClassLabel is the device_class label of a phase that failed before
// its class was known.
const unknownClassLabel = "unknown"

// CreateVolume implements csi.ControllerServer. It is idempotent: the LV
// name derives from the request name, and the LV's tags carry the name and
// class, so a retry (also after a restart) finds the LV it made.
func (s *ControllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (resp *csi.CreateVolumeResponse, err error) {
	start := time.Now()
	classLabel := unknownClassLabel
	phase := sourcePhase(req.GetVolumeContentSource())
	defer func() { s.cfg.Metrics.ObservePhase(phase, classLabel, time.Since(start), err) }()

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
	class, err := classFromParameters(req.GetParameters(), s.cfg.Classes, s.node.Name())
	if err != nil {
		return nil, err
	}
	classLabel = class.Name
	if !s.node.Accepts(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "accessibility_requirements: the requisite topology does not include this node (%s=%s)", topology.Key, s.node.Name())
	}

	lvName := volume.LVNameFor(req.GetName())
	unlock, err := s.lock(lvName, "volume "+req.GetName())
	if err != nil {
		return nil, err
	}
	defer unlock()
	method := eraseMethodFor(class, req.GetVolumeCapabilities())
	c := createCall{req: req, class: class, fsType: fsType, lvName: lvName, method: method, wantSource: wantSource, phase: phase}
	lv, made, err := s.provision(ctx, &c)
	if err != nil {
		return nil, err
	}
	// Outside the room lock: copying or zeroing a large volume must not
	// hold up the other creates of the volume group.
	if volume.CopyPending(lv.Tags) {
		if c.src == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q: LV %s is still to be copied from its source, which cannot be read now: %v", req.GetName(), lv.Name, c.srcErr)
		}
		if lv, err = s.copyInto(ctx, lv, class, c.src, phase); err != nil {
			return nil, err
		}
	}
	if lv, err = s.finish(ctx, lv, made, class, method, clearsSignatures(class, req)); err != nil {
		return nil, err
	}
	if err := s.clearFormatting(lv.VolumeGroup, lv.Name); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: %v", req.GetName(), err)
	}
	return s.createResponse(lv, class, req), nil
}

// createCall is one CreateVolume, as provision needs it.
type createCall struct {
	req        *csi.CreateVolumeRequest
	class      *config.DeviceClass
	fsType     string
	lvName     string
	method     erase.Method
	wantSource []string
	phase      string
	// src is the resolved content source (nil without one, or when it
	// could not be resolved: srcErr says why).
	src    *contentSource
	srcErr error
}

// provision returns the LV of a CreateVolume: the one made before when it
// is a repeat, else a new one made by lvcreate (made is then true). Either
// may still be unfinished (finish makes it ready).
func (s *ControllerServer) provision(ctx context.Context, c *createCall) (lv *lvm.LogicalVolume, made bool, err error) {
	req, class, fsType, lvName, method := c.req, c.class, c.fsType, c.lvName, c.method
	// The room check and lvcreate run under the volume group's room lock,
	// shared with NodeExpandVolume: two volumes (or a volume and a growth)
	// that each fit alone must not both pass the check and together eat
	// into the spare.
	unlockRoom, err := s.cfg.View.LockRoom(ctx, class.VolumeGroup)
	if err != nil {
		return nil, false, toStatus(err, "volume "+req.GetName())
	}
	defer unlockRoom()

	log := klog.FromContext(ctx).WithValues("volume", req.GetName(), "lv", lvName, "deviceClass", class.Name)
	room, err := s.cfg.View.Capacity(class)
	if errors.Is(err, state.ErrClassUnavailable) {
		// A retry for a volume made before the class became unavailable
		// (a PV lost since, say) still gets its volume.
		if lv, ok := s.cfg.View.FindLV(lvName); ok {
			if err := s.compatible(&lv, req, class, c.wantSource); err != nil {
				return nil, false, err
			}
			if redo, err := s.mustRedo(&lv, method); err != nil || redo {
				if err != nil {
					return nil, false, err
				}
				return nil, false, status.Errorf(codes.Unavailable, "volume %q: LV %s was left half-made and device class %s is unavailable now (%v); retry later",
					req.GetName(), volume.VolumeID(lv.VolumeGroup, lv.Name), class.Name, err)
			}
			log.V(2).Info("Volume exists already; its device class is unavailable now", "size", lv.Size, "reason", err)
			return &lv, false, nil
		}
		// Not a fault of the request: RESOURCE_EXHAUSTED makes
		// external-provisioner drop this node and the scheduler pick
		// another, as GetCapacity reports 0 for the class here.
		return nil, false, status.Errorf(codes.ResourceExhausted, "node %s cannot make volumes of device class %s now: %v", s.node.Name(), class.Name, err)
	}
	if err != nil {
		return nil, false, toStatus(err, "device class "+class.Name)
	}
	// LVM rounds a striped LV to whole extents per stripe: size it the same
	// way here, so that limit_bytes and the room check see what lvcreate
	// will make.
	unit := room.ExtentSize
	if !class.Thin() {
		unit = class.LVCreateOptions.SizeUnit(room.ExtentSize)
	}
	size, err := volumeSize(req.GetCapacityRange(), unit, fsType)
	if err != nil {
		return nil, false, err
	}

	if cs := req.GetVolumeContentSource(); cs != nil {
		if c.src, c.srcErr = s.resolveSource(ctx, cs); c.srcErr == nil {
			size, c.srcErr = sourceSize(size, c.src.size, unit, req.GetCapacityRange())
		}
	}
	if lv, ok := s.cfg.View.FindLV(lvName); ok && c.srcErr == nil && volume.CopyPending(lv.Tags) || ok && c.src != nil && c.src.thinInto(class) {
		// A copy left unfinished is redone by the caller; a thin volume
		// made from a smaller source is grown if a crash came between.
		return s.existingFromSource(ctx, &lv, c, size)
	}
	if c.srcErr != nil && !s.hasVolume(lvName) {
		// A volume made from a source stays made when the source is
		// deleted afterwards; only one still to be made needs it.
		return nil, false, c.srcErr
	}
	if lv, ok := s.cfg.View.FindLV(lvName); ok {
		if err := s.compatible(&lv, req, class, c.wantSource); err != nil {
			return nil, false, err
		}
		redo, err := s.mustRedo(&lv, method)
		if err != nil {
			return nil, false, err
		}
		if !redo {
			log.V(2).Info("Volume exists already", "size", lv.Size)
			return &lv, false, nil
		}
		redone, err := s.redo(ctx, &lv)
		if err != nil {
			return nil, false, err
		}
		if !redone {
			return &lv, false, nil
		}
		if room, err = s.cfg.View.Capacity(class); err != nil {
			return nil, false, toStatus(err, "device class "+class.Name)
		}
	}
	if size > room.Available || room.MetadataFull {
		// The view can be stale: space freed outside carve shows only at
		// the next periodic refresh. ResourceExhausted makes Kubernetes
		// move the pod to another node, so read LVM once before saying it.
		if rerr := s.cfg.View.Refresh(ctx); rerr != nil {
			log.Error(rerr, "Refreshing the volume-group view before refusing a volume failed")
		} else if room, err = s.cfg.View.Capacity(class); errors.Is(err, state.ErrClassUnavailable) {
			return nil, false, status.Errorf(codes.ResourceExhausted, "node %s cannot make volumes of device class %s now: %v", s.node.Name(), class.Name, err)
		} else if err != nil {
			return nil, false, toStatus(err, "device class "+class.Name)
		}
	}
	if room.MetadataFull {
		return nil, false, status.Errorf(codes.ResourceExhausted, "volume group %s of device class %s on node %s has no room left in its LVM metadata area "+
			"for one more volume (whatever its free space); see \"Metadata area\" in docs/install.md", class.VolumeGroup, class.Name, s.node.Name())
	}
	if size > room.Available {
		return nil, false, status.Errorf(codes.ResourceExhausted, "device class %s on node %s has %d bytes available (after a spare of %d), %d asked", class.Name, s.node.Name(), room.Available, class.SpareBytes(), size)
	}
	if c.src != nil {
		lv, err := s.makeFromSource(ctx, c, size)
		return lv, false, err
	}

	creq := lvm.CreateRequest{VolumeGroup: class.VolumeGroup, Name: lvName, Size: size,
		Tags: append(volume.VolumeTags(req.GetName(), class.Name, req.GetParameters()), askedTags(req.GetCapacityRange(), size)...)}
	// lvcreate commits a thick LV before it wipes and zeroes it: the mark,
	// made durable first, stays until finish, so that an LV left by a
	// crash in between is never taken for a finished one.
	marked := false
	if class.Thin() {
		creq.ThinPool = class.ThinPool
	} else {
		creq.Options = class.LVCreateOptions
		if marked, err = s.cfg.Marks.Has(class.VolumeGroup, lvName); err == nil && !marked {
			err = s.cfg.Marks.Mark(class.VolumeGroup, lvName)
		}
		if err != nil {
			return nil, false, status.Errorf(codes.Internal, "volume %q: %v", req.GetName(), err)
		}
	}
	stepStart := time.Now()
	lv, err = s.cfg.LVM.CreateLV(ctx, creq)
	s.cfg.Metrics.ObserveStep(metrics.PhaseCreate, metrics.StepLVCreate, class.Name, time.Since(stepStart), err)
	if errors.Is(err, lvm.ErrAlreadyExists) {
		// The view missed it (made outside carve's view, or it was stale):
		// ask LVM and treat it as a repeat.
		existing, gerr := s.cfg.LVM.GetLV(ctx, class.VolumeGroup, lvName)
		if gerr != nil {
			return nil, false, toStatus(gerr, "looking up existing LV "+volume.VolumeID(class.VolumeGroup, lvName))
		}
		if err := s.compatible(existing, req, class, c.wantSource); err != nil {
			return nil, false, err
		}
		if !class.Thin() && !marked {
			// The mark is this call's own, and the LV is not the one
			// it was made for: an LV made before (and finished)
			// that the view missed.
			if err := s.cfg.Marks.Clear(class.VolumeGroup, lvName); err != nil {
				return nil, false, status.Errorf(codes.Internal, "volume %q: %v", req.GetName(), err)
			}
		}
		s.cfg.View.Created(*existing)
		redo, err := s.mustRedo(existing, method)
		if err != nil {
			return nil, false, err
		}
		if redo {
			// Made by a run that crashed before finishing it; the next
			// retry finds it in the view and makes it again.
			redone, err := s.redo(ctx, existing)
			if err != nil {
				return nil, false, err
			}
			if !redone {
				return existing, false, nil
			}
			return nil, false, status.Errorf(codes.Aborted, "volume %q: removed LV %s, left half-made by an earlier attempt; retry to make it again",
				req.GetName(), volume.VolumeID(existing.VolumeGroup, existing.Name))
		}
		return existing, false, nil
	}
	if errors.Is(err, lvm.ErrInsufficientSpace) {
		// lvcreate committed nothing: the mark would only be left over.
		if cerr := s.cfg.Marks.Clear(class.VolumeGroup, lvName); cerr != nil {
			log.Error(cerr, "Clearing the mark of a volume LVM had no room for")
		}
		// LVM had less room than the view: something outside carve took
		// space. Re-read now so that the capacity published next (the
		// provisioner asks again right after this error) is true.
		if rerr := s.cfg.View.Refresh(ctx); rerr != nil {
			log.Error(rerr, "Refreshing the volume-group view after an out-of-space lvcreate failed")
		}
	}
	if err != nil {
		return nil, false, toStatus(err, "creating LV "+volume.VolumeID(class.VolumeGroup, lvName))
	}
	s.cfg.View.Created(*lv)
	log.Info("Created volume", "size", lv.Size)
	return lv, true, nil
}

// askedTags are the tags of a volume of size bytes made for r: the
// asked size, when carve makes more (volume.AskedTag).
func askedTags(r *csi.CapacityRange, size uint64) []string {
	if asked := r.GetRequiredBytes(); asked > 0 && uint64(asked) < size {
		return []string{volume.AskedTag(uint64(asked), size)}
	}
	return nil
}

// mustRedo tells whether an existing LV was left half-made by a crash and
// must be made again: it is still unfinished, nothing is finishing it now,
// and it will not be zeroed (zeroing covers what lvcreate's wipe would have
// done, so finish completes such an LV instead).
func (s *ControllerServer) mustRedo(lv *lvm.LogicalVolume, method erase.Method) (bool, error) {
	if method != erase.None || s.finishing.Running(lv.Name) {
		return false, nil
	}
	return s.unfinished(lv)
}

// unfinished tells whether an LV has not been made ready yet: it has a mark
// (unfinished.Marks), or the tag carve marked LVs with before
// (volume.TagUnfinished; still honoured, never written).
func (s *ControllerServer) unfinished(lv *lvm.LogicalVolume) (bool, error) {
	if volume.IsUnfinished(lv.Tags) {
		return true, nil
	}
	marked, err := s.cfg.Marks.Has(lv.VolumeGroup, lv.Name)
	if err != nil {
		return false, status.Errorf(codes.Internal, "volume %s: %v", volume.VolumeID(lv.VolumeGroup, lv.Name), err)
	}
	return marked, nil
}

// redo removes a half-made LV, which was never handed out, so that it is
// made again with lvcreate's wipe and zeroing. ok is false when LVM shows
// the LV finished after all (the view was older): then it is kept, and the
// caller returns lv as it is.
func (s *ControllerServer) redo(ctx context.Context, lv *lvm.LogicalVolume) (ok bool, err error) {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	// LVM, not the view, decides: removing a volume that was handed out
	// would lose its data.
	cur, err := s.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	switch {
	case errors.Is(err, lvm.ErrNotFound):
		s.cfg.View.Removed(lv.VolumeGroup, lv.Name)
		return true, nil
	case err != nil:
		return false, toStatus(err, "reading half-made LV "+id)
	}
	if half, err := s.unfinished(cur); err != nil || !half {
		if err == nil {
			s.cfg.View.Created(*cur)
			*lv = *cur
		}
		return false, err
	}
	if err := s.cfg.LVM.RemoveLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return false, toStatus(err, "removing half-made LV "+id)
	}
	s.cfg.View.Removed(lv.VolumeGroup, lv.Name)
	klog.FromContext(ctx).Info("Removed an LV left half-made by an earlier CreateVolume; making it again", "volumeID", id)
	return true, nil
}

// compatible checks that an existing LV is the volume req asks for again:
// its name, class and source (wantSource, the tags sourceTags gives), and
// a size within the capacity range.
func (s *ControllerServer) compatible(lv *lvm.LogicalVolume, req *csi.CreateVolumeRequest, class *config.DeviceClass, wantSource []string) error {
	if err := s.sameVolume(lv, req, class, wantSource); err != nil {
		return err
	}
	if !sizeFits(lv.Size, req.GetCapacityRange()) {
		r := req.GetCapacityRange()
		return status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes; asked required_bytes %d, limit_bytes %d", req.GetName(), lv.Size, r.GetRequiredBytes(), r.GetLimitBytes())
	}
	return nil
}

// sameVolume checks the name, class and source of an existing LV against
// a repeated request.
func (s *ControllerServer) sameVolume(lv *lvm.LogicalVolume, req *csi.CreateVolumeRequest, class *config.DeviceClass, wantSource []string) error {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	if !volume.HasVolumeName(lv.Tags, req.GetName()) {
		name, _, _ := volume.VolumeNameFromTags(lv.Tags)
		return status.Errorf(codes.AlreadyExists, "LV %s exists but does not carry volume %q in its tags (found %q)", id, req.GetName(), name)
	}
	if c, _ := volume.ClassFromTags(lv.Tags); c != class.Name || lv.VolumeGroup != class.VolumeGroup {
		return status.Errorf(codes.AlreadyExists, "volume %q exists in device class %q (LV %s); %q asked", req.GetName(), c, id, class.Name)
	}
	if got := volume.SourceTags(lv.Tags); !slices.Equal(got, wantSource) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with content source %q; %q asked", req.GetName(), got, wantSource)
	}
	return nil
}

func (s *ControllerServer) createResponse(lv *lvm.LogicalVolume, class *config.DeviceClass, req *csi.CreateVolumeRequest) *csi.CreateVolumeResponse {
	v := s.volume(lv, class.Name)
	v.ContentSource = req.GetVolumeContentSource()
	return &csi.CreateVolumeResponse{Volume: v}
}

// volume describes an LV as a CSI volume.
func (s *ControllerServer) volume(lv *lvm.LogicalVolume, class string) *csi.Volume {
	return &csi.Volume{
		VolumeId:           volume.VolumeID(lv.VolumeGroup, lv.Name),
		CapacityBytes:      int64(lv.Size),
		VolumeContext:      map[string]string{ParamDeviceClass: class},
		AccessibleTopology: []*csi.Topology{s.node.Segment()},
	}
}

// DeleteVolume implements csi.ControllerServer. It is idempotent: an ID
// that is not carve's, or an LV that is gone from a volume group that is
// there, is success. An LV without carve's owner tag, or one that is open
// (mounted), is FailedPrecondition and is not removed. When the volume
// group of one of this node's classes is missing or cannot be read, the
// LV cannot be seen, so it is not known to be gone: that is Unavailable
// (or Internal), and external-provisioner retries, never dropping the PV
// of an LV that would come back with the disk.
func (s *ControllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (resp *csi.DeleteVolumeResponse, err error) {
	start := time.Now()
	classLabel := unknownClassLabel
	defer func() { s.cfg.Metrics.ObservePhase(metrics.PhaseDelete, classLabel, time.Since(start), err) }()

	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	vg, lvName, perr := volume.ParseVolumeID(id)
	if perr != nil || lvm.ValidateVGName(vg) != nil || lvm.ValidateLVName(lvName) != nil {
		// Not an ID carve hands out, so no volume of carve's to delete.
		klog.FromContext(ctx).V(2).Info("DeleteVolume of an ID that is not carve's; nothing to do", "volumeID", id)
		return &csi.DeleteVolumeResponse{}, nil
	}
	unlock, err := s.lock(lvName, "volume "+id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	lv, found, err := s.lvToDelete(ctx, vg, lvName, id)
	if err != nil {
		return nil, err
	}
	if !found {
		s.clearMark(ctx, vg, lvName)
		return &csi.DeleteVolumeResponse{}, nil
	}
	if !volume.IsCarve(lv.Tags) {
		return nil, status.Errorf(codes.FailedPrecondition, "LV %s does not carry carve's tag %s; carve does not remove it", id, volume.TagOwner)
	}
	if c, ok := volume.ClassFromTags(lv.Tags); ok {
		classLabel = c
	}
	if lv.Attr.Type != lvm.TypeThin {
		// lvremove takes a thick origin's copy-on-write snapshots with
		// it; a thin volume's snapshots are volumes of the pool and
		// outlive it.
		if snaps := s.snapshotsOf(vg, lvName); len(snaps) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s has snapshots %s; delete them first (a thick volume's snapshots cannot outlive it)", id, strings.Join(snaps, ", "))
		}
	}
	s.removeCopySource(ctx, vg, volume.CopySourceLVNameFor(lvName))
	stepStart := time.Now()
	err = s.cfg.LVM.RemoveLV(ctx, vg, lvName)
	s.cfg.Metrics.ObserveStep(metrics.PhaseDelete, metrics.StepLVRemove, classLabel, time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		return nil, vgMissing(id, vg, err)
	case errors.Is(err, lvm.ErrNotFound):
		s.cfg.View.Removed(vg, lvName)
		s.clearMark(ctx, vg, lvName)
		return &csi.DeleteVolumeResponse{}, nil
	case errors.Is(err, lvm.ErrInUse):
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is in use (open or mounted); unstage it first: %v", id, err)
	case err != nil:
		return nil, toStatus(err, "removing "+id)
	}
	s.cfg.View.Removed(vg, lvName)
	s.clearMark(ctx, vg, lvName)
	klog.FromContext(ctx).Info("Deleted volume", "volumeID", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// clearMark drops the marks of a removed LV: the one of a create that
// never finished, and the one of a stage whose mkfs never ended. One left
// over is harmless: CreateVolume of the same name clears them too.
func (s *ControllerServer) clearMark(ctx context.Context, vg, lv string) {
	if err := errors.Join(s.cfg.Marks.Clear(vg, lv), s.clearFormatting(vg, lv)); err != nil {
		klog.FromContext(ctx).Error(err, "Clearing the marks of a removed LV", "vg", vg, "lv", lv)
	}
}

// clearFormatting takes off the formatting mark of vg/lv (ControllerConfig's
// Formatting), if any.
func (s *ControllerServer) clearFormatting(vg, lv string) error {
	if s.cfg.Formatting == nil {
		return nil
	}
	return s.cfg.Formatting.Clear(vg, lv)
}

// vgMissing is DeleteVolume's answer while the volume group is missing.
func vgMissing(id, vg string, err error) error {
	return status.Errorf(codes.Unavailable, "volume %s: volume group %s is missing on this node, so whether its LV is gone cannot be known; "+
		"the deletion waits until the volume group is back (or is removed from the device-class file): %v", id, vg, err)
}

// snapshotsOf names the snapshots (their IDs) of the volume LV vg/name.
func (s *ControllerServer) snapshotsOf(vg, name string) []string {
	var ids []string
	for _, lv := range s.cfg.View.Snapshots() {
		if o, _ := volume.OriginFromTags(lv.Tags); lv.VolumeGroup == vg && (o == name || lv.Origin == name) {
			ids = append(ids, volume.SnapshotID(s.node.Name(), vg, lv.Name))
		}
	}
	return ids
}

// hasVolume tells whether the view holds the LV name.
func (s *ControllerServer) hasVolume(name string) bool {
	_, ok := s.cfg.View.FindLV(name)
	return ok
}

// Busy tells whether a CreateVolume or DeleteVolume of the LV name is in
// flight (the audit never counts such an LV as an orphan).
func (s *ControllerServer) Busy(lvName string) bool { return s.locks.IsHeld(lvName) }

// RemoveOrphan removes the carve LV vg/name that the audit found
// orphaned, under the same per-volume lock as CreateVolume and
// DeleteVolume (busy is an error: the next pass tries again). An LV that
// is gone is success; one without carve's owner tag, with snapshots, or
// open, is refused.
func (s *ControllerServer) RemoveOrphan(ctx context.Context, vg, name string) error {
	if !s.locks.TryAcquire(name) {
		return fmt.Errorf("LV %s: an operation is in flight", volume.VolumeID(vg, name))
	}
	defer s.locks.Release(name)
	lv, err := s.cfg.LVM.GetLV(ctx, vg, name)
	switch {
	case errors.Is(err, lvm.ErrNotFound):
		s.cfg.View.Removed(vg, name)
		return nil
	case err != nil:
		return err
	case !volume.IsCarve(lv.Tags):
		return fmt.Errorf("LV %s does not carry carve's tag %s", volume.VolumeID(vg, name), volume.TagOwner)
	}
	if snaps := s.snapshotsOf(vg, name); len(snaps) > 0 {
		return fmt.Errorf("LV %s has snapshots %v; carve removes it only once they are deleted", volume.VolumeID(vg, name), snaps)
	}
	class, _ := volume.ClassFromTags(lv.Tags)
	start := time.Now()
	err = s.cfg.LVM.RemoveLV(ctx, vg, name)
	s.cfg.Metrics.ObserveStep(metrics.PhaseDelete, metrics.StepLVRemove, class, time.Since(start), err)
	if err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return err
	}
	s.cfg.View.Removed(vg, name)
	return nil
}

// lvToDelete finds the LV a delete names: in the view, else from LVM.
// found is false when the LV is gone or its VG is not one of this node's
// (the delete is then done); a configured VG that is missing is an error,
// so that a delete is never reported done for a volume carve could not see.
func (s *ControllerServer) lvToDelete(ctx context.Context, vg, lvName, id string) (lv lvm.LogicalVolume, found bool, err error) {
	if lv, ok := s.cfg.View.LV(vg, lvName); ok {
		return lv, true, nil
	}
	got, gerr := s.cfg.LVM.GetLV(ctx, vg, lvName)
	switch {
	case errors.Is(gerr, lvm.ErrVolumeGroupNotFound) && s.cfg.Classes.HasVolumeGroup(vg):
		return lvm.LogicalVolume{}, false, vgMissing(id, vg, gerr)
	case errors.Is(gerr, lvm.ErrNotFound):
		return lvm.LogicalVolume{}, false, nil
	case gerr != nil:
		return lvm.LogicalVolume{}, false, toStatus(gerr, "looking up "+id)
	}
	return *got, true, nil
}
