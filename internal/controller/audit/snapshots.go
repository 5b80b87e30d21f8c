package audit

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ReasonSnapshotInvalid is the Event of a snapshot out of copy-on-write space.
const ReasonSnapshotInvalid = "SnapshotInvalid"

// SnapshotContents finds the VolumeSnapshotContent of a carve snapshot.
type SnapshotContents interface {
	// ContentOf returns the content whose handle is id; nil when none (or no
	// snapshot API).
	ContentOf(ctx context.Context, id string) (*SnapshotContent, error)
}

// SnapshotContent is a VolumeSnapshotContent, as its Events name it.
type SnapshotContent struct {
	Name string
	UID  types.UID
	// Snapshot is its VolumeSnapshot ("<namespace>/<name>"), SnapshotUID its UID.
	Snapshot    string
	SnapshotUID types.UID
}

// judgeSnapshots announces each snapshot that turned invalid (a thick one
// out of copy-on-write space), once per connection, on its content and
// VolumeSnapshot: readyToUse stays true, as csi-snapshotter never asks again.
func (a *Auditor) judgeSnapshots(ctx context.Context, log klog.Logger, na *nodeAudit) error {
	ids, err := a.cfg.Nodes.InvalidSnapshots(ctx, na.node)
	if err != nil {
		return fmt.Errorf("listing the snapshots of node %s: %w", na.node, err)
	}
	seen := map[string]bool{}
	var errs []error
	for _, id := range ids {
		seen[id] = true
		if na.invalid[id] {
			continue
		}
		c, err := a.cfg.Contents.ContentOf(ctx, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("finding the VolumeSnapshotContent of invalid snapshot %s: %w", id, err))
			continue
		}
		na.invalid[id] = true
		if c == nil {
			log.Info("Snapshot invalid (it ran out of its copy-on-write space); no VolumeSnapshotContent names it", "snapshot", id)
			continue
		}
		log.Info("Snapshot invalid: it ran out of its copy-on-write space", "snapshot", id, "content", c.Name, "volumeSnapshot", c.Snapshot)
		msg := fmt.Sprintf("snapshot %s on node %s ran out of its copy-on-write space: its content is lost and no restore reads it (FAILED_PRECONDITION), "+
			"though readyToUse stays true. Delete the VolumeSnapshot and take a new one with more space (the device class's snapshotSpacePercent). "+
			"See carve's operations runbook: CarveSnapshotInvalid", id, na.node)
		a.cfg.Events.Event(&corev1.ObjectReference{Kind: "VolumeSnapshotContent", Name: c.Name, UID: c.UID, APIVersion: "snapshot.storage.k8s.io/v1"},
			corev1.EventTypeWarning, ReasonSnapshotInvalid, msg)
		if ns, name, ok := cut(c.Snapshot); ok {
			a.cfg.Events.Event(&corev1.ObjectReference{Kind: "VolumeSnapshot", Namespace: ns, Name: name, UID: c.SnapshotUID, APIVersion: "snapshot.storage.k8s.io/v1"},
				corev1.EventTypeWarning, ReasonSnapshotInvalid, msg)
		}
	}
	for id := range na.invalid {
		if !seen[id] {
			delete(na.invalid, id) // deleted: a new one of that ID is told anew
		}
	}
	return errors.Join(errs...)
}
