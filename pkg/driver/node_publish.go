package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/pkg/fs"
	"github.com/carve-csi/carve/pkg/metrics"
)

// NodePublishVolume implements csi.NodeServer: a bind mount of the staging
// path (filesystem volumes) or of the device node (raw block volumes) onto
// the target, read-only when asked.
func (n *NodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (resp *csi.NodePublishVolumeResponse, err error) {
	start, class := time.Now(), unknownClassLabel
	defer func() { n.cfg.Metrics.ObservePhase(metrics.PhasePublish, class, time.Since(start), err) }()

	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if err := nodeRequireID(id); err != nil {
		return nil, err
	}
	if err := nodeCheckPath(target, "target_path"); err != nil {
		return nil, err
	}
	if err := nodeCheckPath(staging, "staging_target_path"); err != nil {
		return nil, err
	}
	access, err := nodeCapability(req.GetVolumeCapability(), "volume_capability")
	if err != nil {
		return nil, err
	}
	// Read-only when the CO asks (readonly, or a reader-only access mode)
	// or the flags do; "rw" contradicting the CO is refused rather than
	// left to mount(8), where the last of ro and rw would win.
	if req.GetReadonly() && slices.Contains(access.flags, "rw") {
		return nil, status.Error(codes.InvalidArgument, "volume_capability.mount.mount_flags has \"rw\" but readonly is set")
	}
	readOnly := req.GetReadonly() || access.readOnly || slices.Contains(access.flags, "ro")
	if err := n.acquire(id); err != nil {
		return nil, err
	}
	defer n.release(id)

	device, class, err := n.activeDevice(ctx, id, req.GetVolumeContext())
	if err != nil {
		return nil, err
	}

	source := staging
	if access.block {
		source = device
	} else {
		mp, err := n.cfg.FS.MountPoint(staging)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "reading the mount at %s: %v", staging, err)
		}
		if mp == nil || !fs.SameDevice(mp.Device, device) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged at %s: call NodeStageVolume first", id, staging)
		}
	}

	// Already published here?
	mp, err := n.cfg.FS.MountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading the mount at %s: %v", target, err)
	}
	if mp != nil {
		if !fs.SameDevice(mp.Device, device) && !fs.SameDeviceNode(target, device) {
			return nil, status.Errorf(codes.FailedPrecondition, "target_path %s holds %s, not volume %q", target, mp.Device, id)
		}
		if isDir, err := isDirectory(target); err != nil || isDir == access.block {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with another access type than %s", id, target, access.describe())
		}
		if slices.Contains(mp.Opts, "ro") != readOnly {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with read-only %t; the request asks %t", id, target, !readOnly, readOnly)
		}
		if f := flagConflict(mp.Opts, publishOptions(access, readOnly)); !access.block && f != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is published at %s with mount options %v; the request differs in %q", id, target, mp.Opts, f)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}

	if access.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		refs, err := n.cfg.FS.MountsOf(device)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "listing the mounts of %s: %v", device, err)
		}
		for _, r := range refs {
			if !samePath(r, staging) && !samePath(r, target) {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %q has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %s", id, r)
			}
		}
	}

	if access.block {
		err = makeFile(target)
	} else {
		err = os.MkdirAll(target, 0o750)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "creating target_path %s: %v", target, err)
	}

	options := publishOptions(access, readOnly)
	t := time.Now()
	err = n.cfg.FS.Mount(ctx, source, target, "", options)
	n.step(metrics.PhasePublish, metrics.StepBindMount, class, t, err)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "publishing volume %q: %v%s", id, err, n.undoPublish(ctx, target))
	}
	klog.InfoS("Published volume", "volumeID", id, "source", source, "targetPath", target, "readOnly", readOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishOptions are the options of a publish bind mount: the flags (of a
// filesystem volume), then ro last, so that it wins.
func publishOptions(a volumeAccess, readOnly bool) []string {
	options := []string{"bind"}
	if !a.block {
		options = append(options, slices.DeleteFunc(slices.Clone(a.flags), func(f string) bool { return f == "ro" })...)
	}
	if readOnly {
		options = append(options, "ro")
	}
	return options
}

// undoPublish removes whatever a failed publish left mounted at target (the
// target was checked to be no mount point before), so that the retry
// starts from nothing rather than finding a mount without its options.
// It returns what to add to the error message.
func (n *NodeServer) undoPublish(ctx context.Context, target string) string {
	mp, err := n.cfg.FS.MountPoint(target)
	if err != nil {
		return fmt.Sprintf("; reading the mount at %s afterwards failed too: %v", target, err)
	}
	if mp == nil {
		return ""
	}
	// Also when the request's context is what ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := n.cfg.FS.Cleanup(ctx, target); err != nil {
		klog.FromContext(ctx).Error(err, "Undoing a failed publish failed", "targetPath", target)
		return fmt.Sprintf("; undoing the mount at %s failed too: %v", target, err)
	}
	return fmt.Sprintf(" (the mount left at %s was undone)", target)
}

// NodeUnpublishVolume implements csi.NodeServer: it unmounts the target
// and removes it. Repeating it succeeds.
func (n *NodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (resp *csi.NodeUnpublishVolumeResponse, err error) {
	start, id := time.Now(), req.GetVolumeId()
	defer func() {
		n.cfg.Metrics.ObservePhase(metrics.PhaseUnpublish, n.classForMetrics(id), time.Since(start), err)
	}()
	if err := n.unmountAndRemove(ctx, metrics.PhaseUnpublish, id, req.GetTargetPath(), "target_path"); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// makeFile creates path (and its parent) as an empty file, the mount point
// of a raw block volume; an existing file is left alone.
func makeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640) //nolint:gosec // G302, G304: the kubelet's target path; the device bind-mounted on it replaces its mode
	if err != nil {
		return err
	}
	return f.Close()
}

func isDirectory(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return st.IsDir(), nil
}

// samePath tells whether mounted, a mount point as the mount table shows
// it (canonical), is ours, one of carve's own paths: only ours is resolved,
// so that no other mount point is stat'ed.
func samePath(mounted, ours string) bool {
	r, err := filepath.EvalSymlinks(ours)
	if err != nil {
		r = filepath.Clean(ours)
	}
	return mounted == r || mounted == filepath.Clean(ours)
}
