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
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeConfig holds what the Node server needs.
type NodeConfig struct {
	// NodeName is the node ID and the topology segment's value.
	NodeName string
	// MaxVolumes is max_volumes_per_node; 0 means no limit.
	MaxVolumes int64
	LVM        LVM
	// FS formats, mounts, grows and measures filesystems.
	FS fs.Interface
	// Metrics records phases and steps; nil records nothing.
	Metrics *metrics.Recorder
	// Classes and View let NodeExpandVolume check a growth under the room lock;
	// without them a thin volume could grow past the overprovision ratio.
	Classes *deviceclass.Config
	View    *vgview.View
	// Formatting marks volumes whose mkfs has begun and not been seen to end,
	// so a stage after a killed mkfs formats again; nil turns that off.
	Formatting *marks.Marks
	// Eraser zeroes signature regions; nil is erase.Devices.
	Eraser erase.Eraser
	// DevDir is where LVM makes device nodes; empty is volume.DevDir.
	DevDir string
	// LUKS and Keys open encrypted volumes; with either nil none is opened.
	LUKS luks.Interface
	Keys VolumeKeys
	// Cgroups is the host's cgroup v2 hierarchy for IO limits; an empty Root
	// applies none, and a publish of a volume with limits is refused.
	Cgroups iolimit.Cgroups
}

// NodeServer implements csi.NodeServer. What is staged and published is read
// from the mount table, what exists from LVM.
type NodeServer struct {
	csi.UnimplementedNodeServer
	cfg NodeConfig

	// busy makes a second operation on a volume Aborted (kubelet retries)
	// rather than racing the first on the same mount points.
	busy *volumelock.Locks

	// staging holds stage jobs by volume ID: they outlive their call, hold the
	// volume's lock to their end, and keep their result for the retry.
	staging jobs.Set[struct{}]

	// classes caches volume classes for metric labels, so unpublish and
	// unstage need not ask LVM.
	classMu sync.Mutex
	classes map[string]string

	isDeviceNode  func(path string) bool
	deviceOf      func(path string) (iolimit.Device, error)
	hasLUKSHeader func(path string) (bool, error)
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
	n := &NodeServer{cfg: cfg, busy: volumelock.New(), classes: map[string]string{}, isDeviceNode: volume.IsBlockDevice, deviceOf: iolimit.DeviceOf,
		hasLUKSHeader: provision.HasLUKSHeader}
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

// begin starts timing a phase; defer op.End(&err) ends it.
func (n *NodeServer) begin(phase string) *metrics.Op {
	return n.cfg.Metrics.Begin(phase, csiserver.ResultOf)
}

func (n *NodeServer) acquire(volumeID string) error {
	if !n.busy.TryAcquire(volumeID) {
		return status.Errorf(codes.Aborted, "an operation on volume %q is in progress", volumeID)
	}
	return nil
}

func (n *NodeServer) release(volumeID string) { n.busy.Release(volumeID) }

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

// classForMetrics returns the cached class of a volume, else "unknown". It
// never asks LVM: unpublish and unstage must answer whatever state the
// volume group is in (missing, hung).
func (n *NodeServer) classForMetrics(volumeID string) string {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	if c, ok := n.classes[volumeID]; ok {
		return c
	}
	return metrics.UnknownClass
}

// parseID reads a node call's volume ID: NotFound when it is not carve's.
func parseID(id string) (volume.ID, error) {
	vol, err := volume.ParseID(id)
	if err != nil {
		return vol, status.Errorf(codes.NotFound, "volume %q does not exist: %v", id, err)
	}
	return vol, nil
}

func (n *NodeServer) device(vol volume.ID) string { return volume.Device(n.cfg.DevDir, vol) }

var errCopyPending = errors.New("its data copy (restore or clone) has not finished; CreateVolume finishes it")

// findLV reads the LV of a volume and its class. A half-copied volume is
// errCopyPending: CreateVolume never reported it made, so it is not served.
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

func lvGone(err error) bool {
	return errors.Is(err, lvm.ErrVolumeGroupNotFound) || errors.Is(err, lvm.ErrNotFound)
}

func (n *NodeServer) lookup(ctx context.Context, vol volume.ID) (*lvm.LogicalVolume, string, error) {
	lv, class, err := n.findLV(ctx, vol)
	return lv, class, lookupStatus(vol, err)
}

// lookupStatus: NotFound when the LV or its volume group is gone.
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

// activeDevice returns a volume's device node and class, activating its LV.
// The common case runs no LVM command (trusted). The class comes back with
// errors too, for metrics.
func (n *NodeServer) activeDevice(ctx context.Context, vol volume.ID, volumeContext map[string]string) (device, class string, err error) {
	name := volumeContext[volume.ContextVolumeName]
	device = n.device(vol)
	if class = volumeContext[volume.ParamDeviceClass]; class != "" && volume.LVNameFor(name) == vol.LV && n.isDeviceNode(device) && n.trusted(vol, class) {
		return n.openedDevice(vol, device), n.rememberClass(vol.String(), class), nil
	}
	if n.cfg.Classes != nil && !n.cfg.Classes.HasVolumeGroup(vol.VG) {
		return "", metrics.UnknownClass, status.Errorf(codes.FailedPrecondition,
			"volume_id %q: volume group %s is not one of this node's device classes; carve serves only its own volume groups", vol, vol.VG)
	}
	lv, class, err := n.lookup(ctx, vol)
	if err != nil {
		return "", metrics.UnknownClass, err
	}
	// A PV written with another volume's handle reaches nothing: the LV name
	// is derived from the handle.
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
	return n.openedDevice(vol, lv.Device(n.cfg.DevDir)), class, nil
}

// trusted tells whether the fast path may serve vol as class: anyone who
// may write a PV writes the volume context, so the view must confirm it.
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

// activate activates a carve-owned LV: hosts without lvm2 autoactivation
// leave LVs inactive after a reboot.
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

func nodeAccess(c *csi.VolumeCapability) (capability.Access, error) {
	a, err := capability.Parse(c, fs.MkfsTypes)
	var ce *capability.Error
	if errors.As(err, &ce) {
		return a, status.Error(codes.InvalidArgument, ce.In("volume_capability"))
	}
	return a, err
}

// nodeCheckPath requires an absolute path: it reaches mount's argv.
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

// hardeningFlags make device nodes and setuid programs on a volume inert; a
// container running as root can make both.
var hardeningFlags = []string{"nodev", "nosuid"}

// comparableFlags are per-mount flags the mount table shows, so a repeated
// stage or publish can be checked against the existing mount.
var comparableFlags = []string{"ro", "noexec", "noatime", "nodiratime"}

// flagConflict names the first comparable flag on which opts and want
// differ; "" when none does. Filesystem options are taken as agreeing.
func flagConflict(opts, want []string) string {
	for _, f := range comparableFlags {
		if slices.Contains(opts, f) != slices.Contains(want, f) {
			return f
		}
	}
	return ""
}

// unmountAndRemove is unpublish and unstage: unmount path and remove it,
// under the volume's lock. A missing path is success; LVM is never asked.
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
