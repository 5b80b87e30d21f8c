package audit

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ReasonSnapshotInvalid is the Event of a snapshot that ran out of its
// copy-on-write space, on its VolumeSnapshotContent and VolumeSnapshot.
const ReasonSnapshotInvalid = "SnapshotInvalid"

// SnapshotContents finds the VolumeSnapshotContent of a snapshot of
// carve's.
type SnapshotContents interface {
	// ContentOf returns the VolumeSnapshotContent of carve's driver whose
	// snapshot handle is id; nil when there is none (or the cluster has
	// no snapshot API).
	ContentOf(ctx context.Context, id string) (*SnapshotContent, error)
}

// SnapshotContent is a VolumeSnapshotContent, as its Events name it.
type SnapshotContent struct {
	Name string
	UID  types.UID
	// Snapshot is its VolumeSnapshot, "<namespace>/<name>", and
	// SnapshotUID that one's UID; empty when it names none.
	Snapshot    string
	SnapshotUID types.UID
}

// judgeSnapshots announces, once while the node stays connected, each of
// its snapshots that turned invalid (a thick snapshot whose copy-on-write
// space ran out: its content is lost): a Warning on its
// VolumeSnapshotContent and its VolumeSnapshot, whose readyToUse stays
// true (csi-snapshotter does not ask again once a snapshot is ready).
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
			// Told on a later pass.
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
