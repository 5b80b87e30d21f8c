package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/erase"
	"github.com/carve-csi/carve/pkg/fs"
	"github.com/carve-csi/carve/pkg/jobs"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/state"
	"github.com/carve-csi/carve/pkg/unfinished"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/pkg/volumelock"
	"github.com/carve-csi/carve/topology"
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
	// OnChange is called after an LVM mutation (lvextend) so the in-memory
	// capacity view refreshes; may be nil.
	OnChange func()
	// Classes is the device-class file and View the controller's view of
	// the volume groups (the same one): NodeExpandVolume checks a growth
	// against the room of the volume's class (spare, overprovision ratio)
	// under the view's per-volume-group room lock, which CreateVolume
	// holds too, and applies it to the view at once. Without them an
	// expansion is checked by LVM alone, which lets a thin volume grow past
	// its class's overprovision ratio; the plugin role must set both.
	Classes *config.Config
	View    *state.View
	// Formatting marks the volumes whose mkfs has begun and not been seen
	// to end, so that a stage after a killed mkfs makes the filesystem
	// again instead of failing on its remains; nil turns that off.
	Formatting *unfinished.Marks
	// Eraser zeroes the signature regions of such a device; nil is
	// erase.Devices.
	Eraser erase.Eraser
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
	n := &NodeServer{cfg: cfg, busy: volumelock.New(), classes: map[string]string{}, isDeviceNode: isBlockDevice}
	n.staging.Keep = true
	return n
}

// isBlockDevice tells whether path (after symlinks) is a block device node.
func isBlockDevice(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}

// NodeGetCapabilities implements csi.NodeServer.
func (n *NodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return nodeCapabilities(
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	), nil
}

func nodeCapabilities(types ...csi.NodeServiceCapability_RPC_Type) *csi.NodeGetCapabilitiesResponse {
	caps := make([]*csi.NodeServiceCapability, 0, len(types))
	for _, t := range types {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}
}

// NodeGetInfo implements csi.NodeServer.
func (n *NodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             n.cfg.NodeName,
		MaxVolumesPerNode:  n.cfg.MaxVolumes,
		AccessibleTopology: topology.ForNode(n.cfg.NodeName).Segment(),
	}, nil
}

// acquire marks a volume busy; release undoes it.
func (n *NodeServer) acquire(volumeID string) error {
	if !n.busy.TryAcquire(volumeID) {
		return status.Errorf(codes.Aborted, "an operation on volume %q is in progress", volumeID)
	}
	return nil
}

func (n *NodeServer) release(volumeID string) { n.busy.Release(volumeID) }

// classOf returns the cached device class of a volume.
func (n *NodeServer) classOf(volumeID string) (string, bool) {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	c, ok := n.classes[volumeID]
	return c, ok
}

func (n *NodeServer) rememberClass(volumeID string, lv *lvm.LogicalVolume) string {
	c, ok := volume.ClassFromTags(lv.Tags)
	if !ok {
		c = unknownClassLabel
	}
	n.rememberClassName(volumeID, c)
	return c
}

func (n *NodeServer) rememberClassName(volumeID, class string) {
	n.classMu.Lock()
	defer n.classMu.Unlock()
	n.classes[volumeID] = class
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
	if c, ok := n.classOf(volumeID); ok {
		return c
	}
	return unknownClassLabel
}

// step times one step of a phase.
func (n *NodeServer) step(phase, name, class string, start time.Time, err error) {
	n.cfg.Metrics.ObserveStep(phase, name, class, time.Since(start), err)
}

// lookup finds the LV of a volume ID: NotFound when the ID is not carve's
// or the LV does not exist.
func (n *NodeServer) lookup(ctx context.Context, volumeID string) (*lvm.LogicalVolume, error) {
	vg, name, err := volume.ParseVolumeID(volumeID)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: %v", volumeID, err)
	}
	lv, err := n.cfg.LVM.GetLV(ctx, vg, name)
	if errors.Is(err, lvm.ErrVolumeGroupNotFound) {
		return nil, status.Errorf(codes.NotFound, "volume %q cannot be found: its volume group %s is missing on this node", volumeID, vg)
	}
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: no LV %s in volume group %s", volumeID, name, vg)
	}
	if err != nil {
		return nil, toStatus(err, fmt.Sprintf("reading the LV of volume %q", volumeID))
	}
	if volume.CopyPending(lv.Tags) {
		// CreateVolume never reports such a volume made; refuse it all
		// the same rather than serve half a copy.
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q: its data copy (restore or clone) has not finished; CreateVolume finishes it", volumeID)
	}
	n.rememberClass(volumeID, lv)
	return lv, nil
}

// activeDevice returns the device node and device class of a carve
// volume, for stage and publish, activating its LV when it is inactive. An
// active LV has its device node, so the common case runs no LVM command:
// the class is the one CreateVolume put into the volume context.
// Otherwise LVM is asked: a volume that does not exist is NotFound, an
// inactive one is activated (see activate).
func (n *NodeServer) activeDevice(ctx context.Context, id string, volumeContext map[string]string) (device, class string, err error) {
	if vg, name, err := volume.ParseVolumeID(id); err == nil && lvm.ValidateVGName(vg) == nil && lvm.ValidateLVName(name) == nil {
		device = "/dev/" + vg + "/" + name
		if class = volumeContext[ParamDeviceClass]; class != "" && n.isDeviceNode(device) {
			n.rememberClassName(id, class)
			return device, class, nil
		}
	}
	lv, err := n.lookup(ctx, id)
	if err != nil {
		return "", unknownClassLabel, err
	}
	class, _ = n.classOf(id)
	if lv, err = n.activate(ctx, id, lv); err != nil {
		return "", class, err
	}
	return lvDevicePath(lv), class, nil
}

// activate makes sure a volume's LV is active, so that it has a device
// node. After a reboot LVs are inactive unless the host's LVM activated
// them (lvm2's udev rules or its activation service), which hosts without
// lvm2, or with autoactivation restricted, do not do. So the node
// activates the one LV a call needs, nothing else, and only an LV that
// carries carve's owner tag. An active LV is returned as it is.
func (n *NodeServer) activate(ctx context.Context, id string, lv *lvm.LogicalVolume) (*lvm.LogicalVolume, error) {
	if lv.Attr.Active {
		return lv, nil
	}
	if !volume.IsCarve(lv.Tags) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q: LV %s/%s is not active and does not carry carve's tag %s; carve activates only its own volumes",
			id, lv.VolumeGroup, lv.Name, volume.TagOwner)
	}
	got, err := n.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist: activating LV %s/%s: %v", id, lv.VolumeGroup, lv.Name, err)
	}
	if err != nil {
		return nil, toStatus(err, fmt.Sprintf("volume %q: activating its inactive LV %s/%s", id, lv.VolumeGroup, lv.Name))
	}
	klog.FromContext(ctx).Info("Activated the volume's LV, which was inactive", "volumeID", id, "lv", lv.VolumeGroup+"/"+lv.Name, "pool", lv.Pool)
	return got, nil
}

// lvDevicePath is the device node of an LV.
func lvDevicePath(lv *lvm.LogicalVolume) string {
	if lv.Path != "" {
		return lv.Path
	}
	return "/dev/" + lv.VolumeGroup + "/" + lv.Name
}

// nodeFsTypes are the filesystems the node server formats and grows.
var nodeFsTypes = []string{"ext4", "xfs", "btrfs"}

// mountFlagPattern is what a mount flag may hold: mount flags reach the
// argv of mount(8) (as one -o list), so they are checked, not passed blind.
var mountFlagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.=:/+@-]*$`)

// Flags that would change what kind of mount carve makes.
var forbiddenMountFlags = map[string]bool{"bind": true, "rbind": true, "remount": true, "move": true}

// volumeAccess is a validated volume capability.
type volumeAccess struct {
	block    bool
	fsType   string
	flags    []string
	mode     csi.VolumeCapability_AccessMode_Mode
	readOnly bool // the access mode allows reading only
}

// nodeCapability validates a capability; field names the request field
// for messages ("volume_capability").
func nodeCapability(c *csi.VolumeCapability, field string) (volumeAccess, error) {
	var a volumeAccess
	if c == nil {
		return a, status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	if c.GetAccessMode() == nil {
		return a, status.Errorf(codes.InvalidArgument, "%s.access_mode is required", field)
	}
	a.mode = c.GetAccessMode().GetMode()
	if !slices.Contains(supportedAccessModes, a.mode) {
		return a, status.Errorf(codes.InvalidArgument, "%s.access_mode.mode %s is not supported; allowed: %s",
			field, a.mode, accessModeNames())
	}
	a.readOnly = a.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		a.block = true
	case *csi.VolumeCapability_Mount:
		a.fsType = t.Mount.GetFsType()
		if a.fsType == "" {
			a.fsType = DefaultFSType
		}
		if !slices.Contains(nodeFsTypes, a.fsType) {
			return a, status.Errorf(codes.InvalidArgument, "%s.mount.fs_type %q is not supported; allowed: %s",
				field, a.fsType, strings.Join(nodeFsTypes, ", "))
		}
		for i, f := range t.Mount.GetMountFlags() {
			if !mountFlagPattern.MatchString(f) || forbiddenMountFlags[f] {
				return a, status.Errorf(codes.InvalidArgument,
					"%s.mount.mount_flags[%d] %q is not allowed: one option per flag, of letters, digits and _.=:/+@-, not bind, rbind, remount or move",
					field, i, f)
			}
			switch {
			case f == "suid" || f == "dev":
				return a, status.Errorf(codes.InvalidArgument,
					"%s.mount.mount_flags[%d] %q is not allowed: carve mounts volumes nodev,nosuid, so that no device node or setuid program on a volume takes effect",
					field, i, f)
			case f == "rw" && a.readOnly:
				return a, status.Errorf(codes.InvalidArgument,
					"%s.mount.mount_flags[%d] \"rw\" contradicts access mode %s", field, i, a.mode)
			}
			a.flags = append(a.flags, f)
		}
	default:
		return a, status.Errorf(codes.InvalidArgument, "%s.access_type must be block or mount", field)
	}
	return a, nil
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
