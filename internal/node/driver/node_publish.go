package driver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/volume"
)

// NodePublishVolume implements csi.NodeServer: a bind mount of the staging
// path or raw device node onto the target.
func (n *NodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (resp *csi.NodePublishVolumeResponse, err error) {
	op := n.begin(metrics.PhasePublish)
	defer op.End(&err)

	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	access, readOnly, err := publishAccess(req)
	if err != nil {
		return nil, err
	}
	if err := n.acquire(id); err != nil {
		return nil, err
	}
	defer n.release(id)

	vol, err := parseID(id)
	if err != nil {
		return nil, err
	}
	device, class, err := n.activeDevice(ctx, vol, req.GetVolumeContext())
	op.SetClass(class)
	if err != nil {
		return nil, err
	}
	if err := n.checkOpened(ctx, vol, device); err != nil {
		return nil, err
	}
	source, err := n.publishSource(vol, device, staging, access)
	if err != nil {
		return nil, err
	}
	// Before the mount: a pod must never see its volume without its limits.
	if err := n.limitTarget(ctx, vol, device, target); err != nil {
		return nil, err
	}
	switch published, err := n.published(vol, device, target, access, readOnly); {
	case err != nil:
		return nil, err
	case published:
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := n.checkSingleWriter(vol, device, staging, target, access); err != nil {
		return nil, err
	}
	if err := fs.MakeMountPoint(target, access.Block); err != nil {
		return nil, status.Errorf(codes.Internal, "creating target_path %s: %v", target, err)
	}

	options := publishOptions(access, readOnly)
	if err := op.Step(metrics.StepBindMount, func() error { return n.cfg.FS.Mount(ctx, source, target, "", options) }); err != nil {
		return nil, status.Errorf(codes.Internal, "publishing volume %q: %v%s", id, err, n.undoPublish(ctx, target))
	}
	klog.FromContext(ctx).Info("Published volume", "volumeID", id, "source", source, "targetPath", target, "readOnly", readOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishAccess checks a publish and tells whether to mount read-only. "rw"
// contradicting the CO is refused rather than left to mount(8), where the
// last of ro and rw wins.
func publishAccess(req *csi.NodePublishVolumeRequest) (a capability.Access, readOnly bool, err error) {
	if err := nodeRequireID(req.GetVolumeId()); err != nil {
		return a, false, err
	}
	if err := nodeCheckPath(req.GetTargetPath(), "target_path"); err != nil {
		return a, false, err
	}
	if err := nodeCheckPath(req.GetStagingTargetPath(), "staging_target_path"); err != nil {
		return a, false, err
	}
	if a, err = nodeAccess(req.GetVolumeCapability()); err != nil {
		return a, false, err
	}
	if req.GetReadonly() && slices.Contains(a.Flags, "rw") {
		return a, false, status.Error(codes.InvalidArgument, "volume_capability.mount.mount_flags has \"rw\" but readonly is set")
	}
	return a, req.GetReadonly() || a.ReadOnly || slices.Contains(a.Flags, "ro"), nil
}

// publishSource is the raw device node, or the staging path, which must
// hold the volume's device.
func (n *NodeServer) publishSource(vol volume.ID, device, staging string, access capability.Access) (string, error) {
	if access.Block {
		return device, nil
	}
	mp, err := n.cfg.FS.MountPoint(staging)
	if err != nil {
		return "", status.Errorf(codes.Internal, "reading the mount at %s: %v", staging, err)
	}
	if mp == nil || !fs.SameDevice(mp.Device, device) {
		return "", status.Errorf(codes.FailedPrecondition, "volume %q is not staged at %s: call NodeStageVolume first", vol, staging)
	}
	return staging, nil
}

// published tells whether vol is published at target as asked; anything
// else there is refused.
func (n *NodeServer) published(vol volume.ID, device, target string, access capability.Access, readOnly bool) (bool, error) {
	mp, err := n.cfg.FS.MountPoint(target)
	if err != nil {
		return false, status.Errorf(codes.Internal, "reading the mount at %s: %v", target, err)
	}
	if mp == nil {
		return false, nil
	}
	if !fs.SameDevice(mp.Device, device) && !fs.SameDeviceNode(target, device) {
		return false, status.Errorf(codes.FailedPrecondition, "target_path %s holds %s, not volume %q", target, mp.Device, vol)
	}
	if isDir, err := fs.IsDirectory(target); err != nil || isDir == access.Block {
		return false, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with another access type than %s", vol, target, access.Describe())
	}
	if slices.Contains(mp.Opts, "ro") != readOnly {
		return false, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with read-only %t; the request asks %t", vol, target, !readOnly, readOnly)
	}
	if f := flagConflict(mp.Opts, publishOptions(access, readOnly)); !access.Block && f != "" {
		return false, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with mount options %v; the request differs in %q", vol, target, mp.Opts, f)
	}
	return true, nil
}

// checkSingleWriter refuses a second publish of a SINGLE_NODE_SINGLE_WRITER
// volume.
func (n *NodeServer) checkSingleWriter(vol volume.ID, device, staging, target string, access capability.Access) error {
	if access.Mode != csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		return nil
	}
	refs, err := n.cfg.FS.MountsOf(device)
	if err != nil {
		return status.Errorf(codes.Internal, "listing the mounts of %s: %v", device, err)
	}
	for _, r := range refs {
		if !fs.SamePath(r, staging) && !fs.SamePath(r, target) {
			return status.Errorf(codes.FailedPrecondition, "volume %q has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %s", vol, r)
		}
	}
	return nil
}

// publishOptions puts ro last, so that it wins.
func publishOptions(a capability.Access, readOnly bool) []string {
	options := []string{"bind"}
	if !a.Block {
		options = append(options, slices.DeleteFunc(slices.Clone(a.Flags), func(f string) bool { return f == "ro" })...)
	}
	if readOnly {
		options = append(options, "ro")
	}
	return options
}

// undoPublish unmounts what a failed publish left, so the retry starts
// clean. It returns what to add to the error message.
func (n *NodeServer) undoPublish(ctx context.Context, target string) string {
	mp, err := n.cfg.FS.MountPoint(target)
	if err != nil {
		return fmt.Sprintf("; reading the mount at %s afterwards failed too: %v", target, err)
	}
	if mp == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := n.cfg.FS.Cleanup(ctx, target); err != nil {
		klog.FromContext(ctx).Error(err, "Undoing a failed publish failed", "targetPath", target)
		return fmt.Sprintf("; undoing the mount at %s failed too: %v", target, err)
	}
	return fmt.Sprintf(" (the mount left at %s was undone)", target)
}

// NodeUnpublishVolume implements csi.NodeServer; repeating it succeeds.
func (n *NodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := n.unmountAndRemove(ctx, metrics.PhaseUnpublish, req.GetVolumeId(), req.GetTargetPath(), "target_path"); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}
