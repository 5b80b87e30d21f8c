// Crash-safe marks of a stage's mkfs: a stage that finds a mark undoes what
// an unfinished mkfs left.

package driver

import (
	"context"
	"errors"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/volume"
)

// formatting marks vol as being formatted, before mkfs. The mark names the
// LV's UUID so it is never taken for a later LV of that name.
func (n *NodeServer) formatting(ctx context.Context, vol volume.ID) error {
	if n.cfg.Formatting == nil {
		return nil
	}
	var err error
	if uuid := n.lvUUID(ctx, vol); uuid != "" {
		err = n.cfg.Formatting.MarkOf(vol.VG, vol.LV, uuid)
	} else {
		err = n.cfg.Formatting.Mark(vol.VG, vol.LV)
	}
	return markStatus(vol, err)
}

// formatted removes the mark once the filesystem is mounted: a mark left on
// a volume a pod wrote to would make the next stage probe it.
func (n *NodeServer) formatted(vol volume.ID) error {
	if n.cfg.Formatting == nil {
		return nil
	}
	return markStatus(vol, n.cfg.Formatting.Clear(vol.VG, vol.LV))
}

// markStatus: a full state directory is RESOURCE_EXHAUSTED.
func markStatus(vol volume.ID, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return status.Errorf(codes.ResourceExhausted, "volume %q: the disk of carve's state directory (--state-dir) is full: %v", vol, err)
	}
	return status.Errorf(codes.Internal, "volume %q: %v", vol, err)
}

// lvUUID is vol's LV UUID from the view, else LVM (the view lacks a new LV
// until its refresh); "" makes a mark that names no LV.
func (n *NodeServer) lvUUID(ctx context.Context, vol volume.ID) string {
	if n.cfg.View != nil {
		if lv, ok := n.cfg.View.LV(vol.VG, vol.LV); ok && lv.UUID != "" {
			return lv.UUID
		}
	}
	lv, err := n.cfg.LVM.GetLV(ctx, vol.VG, vol.LV)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the LV's UUID for its formatting mark; the mark names no LV", "volumeID", vol.String())
		return ""
	}
	return lv.UUID
}

// undoUnfinishedMkfs handles a mark an earlier stage left. The device
// decides: another LV's mark, or a finished fsType filesystem, drops it;
// remains of an unfinished mkfs are zeroed so the stage formats again.
func (n *NodeServer) undoUnfinishedMkfs(ctx context.Context, vol volume.ID, device, fsType string) error {
	if n.cfg.Formatting == nil {
		return nil
	}
	owner, marked, err := n.cfg.Formatting.Owner(vol.VG, vol.LV)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: %v", vol, err)
	}
	if !marked {
		return nil
	}
	log := klog.FromContext(ctx).WithValues("volumeID", vol.String(), "device", device)
	if owner != "" {
		if uuid := n.lvUUID(ctx, vol); uuid != "" && uuid != owner {
			log.Info("Dropping a formatting mark of an earlier LV of the same name", "markedLV", owner, "lv", uuid)
			return n.formatted(vol)
		}
	}
	state, err := n.cfg.FS.ProbeMkfs(ctx, device, fsType)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: an earlier mkfs of %s was not seen to end, and reading its superblock failed: %v", vol, device, err)
	}
	switch state {
	case fs.MkfsFinished:
		log.Info("The volume is marked as being formatted, but holds a finished filesystem: dropping the mark and keeping the filesystem", "fsType", fsType)
		return n.formatted(vol)
	case fs.MkfsUnfinished:
		if _, err := n.cfg.Eraser.Erase(ctx, device, erase.Signatures); err != nil {
			return status.Errorf(codes.Internal, "volume %q: an earlier mkfs of %s did not end, and zeroing what it left failed: %v", vol, device, err)
		}
		log.Info("An earlier mkfs of the volume did not end; zeroed its signature regions to make the filesystem again", "fsType", fsType)
	}
	return nil
}
