package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/iolimit"
	"github.com/carve-csi/carve/internal/node/jobs"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeConfig holds what the Node server needs; main builds the real ones.
type NodeConfig struct {
	// NodeName is the Kubernetes node name: the node ID and the value of
	// the topology segment.
	NodeName string
	// MaxVolumes is max_volumes_per_node; 0 means no limit.
	MaxVolumes int64
	// LVM is the same interface the controller uses.
	LVM LVM
	// FS formats, mounts, grows and measures filesystems: fs.New with the
	// real mounter and exec in main, fakes in tests.
	FS fs.Interface
	// Metrics records phases and steps; nil records nothing.
	Metrics *metrics.Recorder
	// Classes and View (the controller's, shared) let NodeExpandVolume check a
	// growth against its class's room under the room lock CreateVolume takes;
	// without them LVM alone checks, and a thin volume could grow past the
	// overprovision ratio. The node role sets both.
	Classes *deviceclass.Config
	View    *vgview.View
	// Formatting marks the volumes whose mkfs has begun and not been seen
	// to end, so that a stage after a killed mkfs makes the filesystem
	// again instead of failing on its remains; nil turns that off.
	Formatting *marks.Marks
	// Eraser zeroes the signature regions of such a device; nil is
	// erase.Devices.
	Eraser erase.Eraser
	// DevDir is the directory LVM makes device nodes under; empty is
	// volume.DevDir of the plugin's environment ($DM_DEV_DIR or /dev, as
	// the lvm client reads it), read once by NewNodeServer.
	DevDir string
	// Cgroups is the host's cgroup v2 hierarchy, where a volume's IO
	// limits go into the io.max of the pods it is published to; an empty
	// Root applies none, and a publish of a volume with limits is then
	// refused.
	Cgroups iolimit.Cgroups
}

// NodeServer implements csi.NodeServer. It keeps no state of its own
// beyond a per-volume guard and a cache of metric labels: what is staged
// and published is read from the mount table, what exists from LVM.
type NodeServer struct {
	csi.UnimplementedNodeServer
	cfg NodeConfig

	// busy holds the IDs of volumes with an operation in flight: a second
	// operation on the same volume gets Aborted and is retried by kubelet,
	// rather than racing the first on the same mount points.
	busy *volumelock.Locks

	// staging holds the stage jobs (format and mount) by volume ID: they
	// outlive the call that started them, hold the volume's lock to their
	// end, and keep their result for the retry (see NodeStageVolume).
	staging jobs.Set[struct{}]

	// classes caches the device class of a volume for metric labels, so
	// unpublish and unstage need not ask LVM.
	classMu sync.Mutex
	classes map[string]string

	// isDeviceNode tells whether path is a block device node; tests replace it.
	isDeviceNode func(path string) bool
	// deviceOf reads a block device node's numbers; tests replace it.
	deviceOf func(path string) (iolimit.Device, error)
}

var _ csi.NodeServer = (*NodeServer)(nil)

// NewNodeServer returns the Node server of cfg.
func NewNodeServer(cfg NodeConfig) *NodeServer {
	if cfg.Classes == nil || cfg.View == nil {
		klog.ErrorS(nil, "NodeConfig has no device classes or view: NodeExpandVolume cannot check a growth against the class's spare and overprovision ratio")
	}
	if cfg.Eraser == nil {
		cfg.Eraser = erase.Devices{}
	}
	if cfg.DevDir == "" {
		cfg.DevDir = volume.DevDir(os.Environ())
	}
	n := &NodeServer{cfg: cfg, busy: volumelock.New(), classes: map[string]string{}, isDeviceNode: volume.IsBlockDevice, deviceOf: iolimit.DeviceOf}
	n.staging.Keep = true
	return n
}

// NodeGetCapabilities implements csi.NodeServer.
func (n *NodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return csiserver.NodeCapabilities(
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	), nil
}

// NodeGetInfo implements csi.NodeServer.
func (n *NodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             n.cfg.NodeName,
		MaxVolumesPerNode:  n.cfg.MaxVolumes,
		AccessibleTopology: nodeTopology{name: n.cfg.NodeName}.segment(),
	}, nil
}

// begin starts timing a phase of a node call; the phase ends with the
// call (defer op.End(&err)), labelled with the gRPC code it returns.
func (n *NodeServer) begin(phase string) *metrics.Op {
	return n.cfg.Metrics.Begin(phase, csiserver.ResultOf)
}

// acquire marks a volume busy; release undoes it.
func (n *NodeServer) acquire(volumeID string) error {
	if !n.busy.TryAcquire(volumeID) {
		return status.Errorf(codes.Aborted, "an operation on volume %q is in progress", volumeID)
	}
	return nil
}

func (n *NodeServer) release(volumeID string) { n.busy.Release(volumeID) }

// rememberClass caches the device class of a volume (for metric labels of
// later calls) and returns it.
func (n *NodeServer) rememberClass(volumeID, class string) string {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	n.classes[volumeID] = class
	return class
}

func (n *NodeServer) forgetClass(volumeID string) {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	delete(n.classes, volumeID)
}

// classForMetrics returns the class of a volume for a metric label: from
// the cache (filled by stage and publish), else "unknown". It never asks
// LVM: unpublish and unstage must work, and answer at once, whatever state
// the volume's volume group is in (missing, unreadable, hung).
func (n *NodeServer) classForMetrics(volumeID string) string {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	if c, ok := n.classes[volumeID]; ok {
		return c
	}
	return metrics.UnknownClass
}

// parseID reads the volume ID of a node call, once: NotFound when it is
// not carve's.
func parseID(id string) (volume.ID, error) {
	vol, err := volume.ParseID(id)
	if err != nil {
		return vol, status.Errorf(codes.NotFound, "volume %q does not exist: %v", id, err)
	}
	return vol, nil
}

func (n *NodeServer) device(vol volume.ID) string { return volume.Device(n.cfg.DevDir, vol) }

// errCopyPending is findLV's error for a volume whose data copy (restore
// or clone) has not finished.
var errCopyPending = errors.New("its data copy (restore or clone) has not finished; CreateVolume finishes it")

// findLV reads the LV of a volume and its device class (which it caches
// for metric labels). Its errors are lvm's (ErrNotFound,
// ErrVolumeGroupNotFound, ...) and errCopyPending: CreateVolume never
// reports such a volume made; it is refused all the same rather than
// served as half a copy.
func (n *NodeServer) findLV(ctx context.Context, vol volume.ID) (*lvm.LogicalVolume, string, error) {
	lv, err := n.cfg.LVM.GetLV(ctx, vol.VG, vol.LV)
	if err != nil {
		return nil, "", err
	}
	if volume.CopyPending(lv.Tags) {
		return nil, "", errCopyPending
	}
	class, ok := volume.ClassFromTags(lv.Tags)
	if !ok {
		class = metrics.UnknownClass
	}
	return lv, n.rememberClass(vol.String(), class), nil
}

// lvGone tells whether an error of findLV says the volume's LV (or its
// whole volume group) is gone.
func lvGone(err error) bool {
	return errors.Is(err, lvm.ErrVolumeGroupNotFound) || errors.Is(err, lvm.ErrNotFound)
}

// lookup is findLV for a call that needs the LV, its errors as statuses
// (lookupStatus).
func (n *NodeServer) lookup(ctx context.Context, vol volume.ID) (*lvm.LogicalVolume, string, error) {
	lv, class, err := n.findLV(ctx, vol)
	return lv, class, lookupStatus(vol, err)
}

// lookupStatus is the status of an error of findLV: NotFound when the LV
// or its volume group is gone.
func lookupStatus(vol volume.ID, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		return status.Errorf(codes.NotFound, "volume %q cannot be found: its volume group %s is missing on this node", vol, vol.VG)
	case errors.Is(err, lvm.ErrNotFound):
		return status.Errorf(codes.NotFound, "volume %q does not exist: no LV %s in volume group %s", vol, vol.LV, vol.VG)
	case errors.Is(err, errCopyPending):
		return status.Errorf(codes.FailedPrecondition, "volume %q: %v", vol, err)
	}
	return nodestatus.Of(err, fmt.Sprintf("reading the LV of volume %q", vol))
}

// activeDevice returns the device node and device class of a carve volume
// for stage and publish, activating its LV when inactive. The common case
// runs no LVM command: the volume context's class is trusted when the view
// agrees. Otherwise LVM is asked: a volume group no class uses, an LV not
// carve's or half-copied is FailedPrecondition, a missing one NotFound. The
// class comes back with an error too, for the call's metrics.
func (n *NodeServer) activeDevice(ctx context.Context, vol volume.ID, volumeContext map[string]string) (device, class string, err error) {
	name := volumeContext[volume.ContextVolumeName]
	device = n.device(vol)
	if class = volumeContext[volume.ParamDeviceClass]; class != "" && volume.LVNameFor(name) == vol.LV && n.isDeviceNode(device) && n.trusted(vol, class) {
		return device, n.rememberClass(vol.String(), class), nil
	}
	if n.cfg.Classes != nil && !n.cfg.Classes.HasVolumeGroup(vol.VG) {
		return "", metrics.UnknownClass, status.Errorf(codes.FailedPrecondition,
			"volume_id %q: volume group %s is not one of this node's device classes; carve serves only its own volume groups", vol, vol.VG)
	}
	lv, class, err := n.lookup(ctx, vol)
	if err != nil {
		return "", metrics.UnknownClass, err
	}
	// A handle is served only under the name its LV was made for (its LV
	// name is derived from it): a PV written with another volume's handle
	// reaches nothing, whoever wrote it.
	if volume.LVNameFor(name) != vol.LV {
		return "", class, status.Errorf(codes.FailedPrecondition,
			"volume_context %s=%q does not name volume %q: carve serves a volume only to the PersistentVolume made for it (CreateVolume writes the name into its volumeAttributes)",
			volume.ContextVolumeName, name, vol)
	}
	if lv, err = n.activate(ctx, vol, lv); err != nil {
		return "", class, err
	}
	if !volume.IsCarve(lv.Tags) {
		return "", class, status.Errorf(codes.FailedPrecondition, "volume_id %q: LV %s/%s does not carry carve's tag %s; carve serves only its own volumes",
			vol, lv.VolumeGroup, lv.Name, volume.TagOwner)
	}
	return lv.Device(n.cfg.DevDir), class, nil
}

// trusted tells whether the fast path may serve vol as a volume of class:
// the volume context is anyone's who may write a PV, so the class must be
// this node's, of the handle's volume group, and the view must hold the LV as
// carve's, of that class, its copy done.
func (n *NodeServer) trusted(vol volume.ID, class string) bool {
	if n.cfg.Classes == nil || n.cfg.View == nil {
		return false
	}
	if d, ok := n.cfg.Classes.Class(class); !ok || d.VolumeGroup != vol.VG {
		return false
	}
	lv, ok := n.cfg.View.LV(vol.VG, vol.LV)
	if !ok || volume.CopyPending(lv.Tags) {
		return false
	}
	kind, lvClass, ok := volume.Owned(lv.Tags)
	return ok && kind == volume.KindVolume && lvClass == class
}

// activate makes sure a volume's LV is active, so that it has a device node:
// hosts without lvm2's autoactivation leave LVs inactive after a reboot. Only
// the one LV a call needs is activated, and only if carve's owner tag is on
// it.
func (n *NodeServer) activate(ctx context.Context, vol volume.ID, lv *lvm.LogicalVolume) (*lvm.LogicalVolume, error) {
	if lv.Attr.Active {
		return lv, nil
	}
	if !volume.IsCarve(lv.Tags) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q: LV %s/%s is not active and does not carry carve's tag %s; carve activates only its own volumes",
			vol, lv.VolumeGroup, lv.Name, volume.TagOwner)
	}
	got, err := n.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: activating LV %s/%s: %v", vol, lv.VolumeGroup, lv.Name, err)
	}
	if err != nil {
		return nil, nodestatus.Of(err, fmt.Sprintf("volume %q: activating its inactive LV %s/%s", vol, lv.VolumeGroup, lv.Name))
	}
	klog.FromContext(ctx).Info("Activated the volume's LV, which was inactive", "volumeID", vol.String(), "lv", lv.VolumeGroup+"/"+lv.Name, "pool", lv.Pool)
	return got, nil
}

// nodeAccess reads the capability of a node call (volume_capability)
// with capability.Parse: the node formats and grows the filesystems
// internal/node/fs makes.
func nodeAccess(c *csi.VolumeCapability) (capability.Access, error) {
	a, err := capability.Parse(c, fs.MkfsTypes)
	var ce *capability.Error
	if errors.As(err, &ce) {
		return a, status.Error(codes.InvalidArgument, ce.In("volume_capability"))
	}
	return a, err
}

// nodeCheckPath validates a path the CO gives: required and absolute (it
// reaches the argv of mount and of the filesystem tools).
func nodeCheckPath(p, field string) error {
	if p == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return status.Errorf(codes.InvalidArgument, "%s %q must be an absolute path", field, p)
	}
	return nil
}

func nodeRequireID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "volume_id is required")
	}
	return nil
}

// hardeningFlags are the options of every filesystem mount carve makes: a
// device node or a setuid program on a volume does nothing, whoever wrote
// it (a container running as root can make both).
var hardeningFlags = []string{"nodev", "nosuid"}

// comparableFlags are the mount flags a user may ask for that the mount
// table shows for a mount point (per-mount flags, unlike filesystem
// options), so a repeated stage or publish can be checked against the
// mount that is there.
var comparableFlags = []string{"ro", "noexec", "noatime", "nodiratime"}

// flagConflict names the first comparable flag on which the mount options
// opts and the wanted flags differ; "" when they agree on all of them.
// Filesystem options (discard, data=...) cannot be told from the mount
// table and are taken as agreeing.
func flagConflict(opts, want []string) string {
	for _, f := range comparableFlags {
		if slices.Contains(opts, f) != slices.Contains(want, f) {
			return f
		}
	}
	return ""
}

// unmountAndRemove is the whole of unpublish and unstage, timed as phase:
// unmount path if it is mounted and remove it, under the volume's lock. A
// path that is not there (never staged, or already cleaned up) is
// success. The class label is the cached one: LVM is never asked.
func (n *NodeServer) unmountAndRemove(ctx context.Context, phase, id, path, field string) (err error) {
	op := n.begin(phase)
	op.SetClass(n.classForMetrics(id))
	defer op.End(&err)

	if err := nodeRequireID(id); err != nil {
		return err
	}
	if err := nodeCheckPath(path, field); err != nil {
		return err
	}
	if err := n.acquire(id); err != nil {
		return err
	}
	defer n.release(id)

	if err := op.Step(metrics.StepUnmount, func() error { return n.cfg.FS.Cleanup(ctx, path) }); err != nil {
		return status.Errorf(codes.Internal, "%s of volume %q: unmounting %s %q: %v", phase, id, field, path, err)
	}
	klog.FromContext(ctx).Info("Unmounted and removed", "phase", phase, "volumeID", id, field, path)
	return nil
}
