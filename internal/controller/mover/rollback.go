// The failure policy of a move: retry, abort before stop, roll back after.

package mover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
)

// failed handles a step's failure: a retryable one is retried Config.Retries
// times (maxSeedRetries while seeding), then the move aborts before stopping
// or rolls back after.
func (m *Mover) failed(ctx context.Context, mv move, attempt int, what string, err error) error {
	limit := m.cfg.Retries
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseSeeding {
		limit = maxSeedRetries
	}
	if retryable(err) && attempt < limit {
		m.wait(ctx, mv, fmt.Sprintf("%s failed (retrying): %v", what, err))
		return fmt.Errorf("%s: %w", what, err)
	}
	why := abortFailed + what + ": " + err.Error()
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseSeeding {
		return m.abort(ctx, mv, why)
	}
	return m.startRollBack(ctx, mv, why)
}

// retryable tells an API error or a CSI code that may succeed later.
func retryable(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return true
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// abort undoes a move before stopping: target and seed deleted, the reclaim
// policy restored, annotations and request removed.
func (m *Mover) abort(ctx context.Context, mv move, why string) error {
	pv := mv.pv
	m.seeds.drop(pv.Name)
	if pv.Annotations[moveapi.AnnAbort] != why {
		var err error
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnAbort: why}); err != nil {
			return err
		}
	}
	if hasCopy(pv) {
		bad, err := m.vouchOld(ctx, pv)
		if err != nil {
			return err
		}
		if bad != "" {
			mv.pv = pv
			return m.park(ctx, mv, "aborting ("+strings.TrimPrefix(why, abortFailed)+"), but "+bad)
		}
	}
	if err := m.deleteTarget(ctx, pv); err != nil {
		return err
	}
	pv = pv.DeepCopy()
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(pv.Annotations[moveapi.AnnReclaimPolicy])
	for k := range pv.Annotations {
		if strings.HasPrefix(k, moveapi.AnnPrefix) {
			delete(pv.Annotations, k)
		}
	}
	if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("restoring PV %s: %w", pv.Name, err)
	}
	result, reason, msg := ResultAborted, moveapi.ReasonAborted, "Move aborted as asked; the claim stays on its volume on node "+pinnedFrom(pv, m.cfg.TopologyKey)
	if w, ok := strings.CutPrefix(why, abortFailed); ok {
		result, reason, msg = ResultFailed, moveapi.ReasonMoveFailed, "Move to node "+mv.to+" failed, the claim stays on its volume on node "+pinnedFrom(pv, m.cfg.TopologyKey)+": "+w
	}
	klog.FromContext(ctx).Info("Move aborted", "result", result, "why", why)
	m.tell(mv, eventType(reason), reason, msg)
	m.moves.WithLabelValues(result).Inc()
	return m.dropRequest(ctx, mv.ns, mv.name, mv.uid)
}

func eventType(reason string) string {
	if reason == moveapi.ReasonMoveFailed || reason == moveapi.ReasonRolledBack {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// deleteTarget deletes the move's target and seed by the IDs their answers
// gave, or, when an answer was lost, by the IDs their names give.
func (m *Mover) deleteTarget(ctx context.Context, pv *corev1.PersistentVolume) error {
	id := pv.Annotations[moveapi.AnnTargetID]
	if id == "" && pv.Annotations[moveapi.AnnSeed] != "" {
		var err error
		if id, err = m.targetID(ctx, pv); err != nil {
			return err
		}
	}
	if id != "" {
		node := pv.Annotations[moveapi.AnnMoveTo]
		if _, err := m.cfg.Volumes.DeleteVolumeOn(ctx, node, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			if status.Code(err) == codes.Unavailable {
				err = fmt.Errorf("%w: %w", errTargetAway, err)
			}
			return fmt.Errorf("deleting the target volume %s on node %s: %w", id, node, err)
		}
	}
	return m.deleteSeed(ctx, pv)
}

var errTargetAway = errors.New("the target's node is away")

func (m *Mover) deleteSeed(ctx context.Context, pv *corev1.PersistentVolume) error {
	seed := pv.Annotations[moveapi.AnnSeed]
	if seed == "" && pv.Annotations[moveapi.AnnSeedName] != "" {
		seed = m.seedID(pv, seedName(pv))
	}
	if seed != "" {
		if _, err := m.cfg.Volumes.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: seed}); err != nil {
			return fmt.Errorf("deleting the seed %s: %w", seed, err)
		}
	}
	return nil
}

// deleteLeft deletes the target and seed an earlier move of the PV to the
// same node may have left: CreateVolume is idempotent by name and would
// answer with the old target and its data.
func (m *Mover) deleteLeft(ctx context.Context, mv move) error {
	id, err := m.targetID(ctx, mv.pv)
	if err != nil {
		return err
	}
	if id != "" {
		if _, err := m.cfg.Volumes.DeleteVolumeOn(ctx, mv.to, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			return fmt.Errorf("deleting volume %s (%s) on node %s: %w", id, mv.target, mv.to, err)
		}
	}
	if seed := m.seedID(mv.pv, SeedName(mv.pv.Name, mv.to, "")); seed != "" {
		if _, err := m.cfg.Volumes.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: seed}); err != nil {
			return fmt.Errorf("deleting snapshot %s: %w", seed, err)
		}
	}
	return nil
}

// startRollBack turns back a move that stopped the workload; a failure is
// one MoveFailed Event.
func (m *Mover) startRollBack(ctx context.Context, mv move, why string) error {
	reason, failed := strings.CutPrefix(why, abortFailed)
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseCatchingUp {
		// With the source's node lost too, rolling back would bind the claim to an
		// unreadable volume and delete the target, the only copy left: park.
		bad, err := m.vouchOld(ctx, mv.pv)
		if err != nil {
			return err
		}
		if bad != "" {
			if !failed {
				reason = "asked to abort"
			}
			return m.park(ctx, mv, reason+", but "+bad)
		}
	}
	klog.FromContext(ctx).Info("Rolling the move back", "why", why)
	extra := map[string]string{moveapi.AnnAbort: why}
	if err := m.advance(ctx, mv, moveapi.PhaseRollingBack, extra, "rolling back ("+reason+"): the claim is made again on its old volume"); err != nil {
		return err
	}
	if failed {
		m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonMoveFailed, "Move to node "+mv.to+" failed after the workload stopped, rolling back to the old volume "+
			mv.pv.Name+" on node "+pinnedFrom(mv.pv, m.cfg.TopologyKey)+": "+reason)
	}
	return nil
}

// rollBack pre-binds the old PV to the claim, makes the claim again, and
// once bound deletes target and seed. A target whose node stays away is
// left; the next move to that node deletes it first (deleteLeft).
func (m *Mover) rollBack(ctx context.Context, mv move, attempt int) (time.Duration, error) {
	pv := mv.pv
	claims := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns)
	claim, err := claims.Get(ctx, mv.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	if err == nil && claim.UID == mv.uid && claim.DeletionTimestamp != nil {
		// The old claim is still being deleted (its pods stopping).
		return m.cfg.Poll, nil
	}
	// Keep a UID the PV controller wrote (the claim made again) or the old
	// claim's (aborted before stopping): taking it away leaves the claim Lost.
	var again types.UID
	if err == nil {
		again = claim.UID
	}
	r := pv.Spec.ClaimRef
	refOK := r != nil && (r.UID == "" || r.UID == again) && r.Namespace == mv.ns && r.Name == mv.name
	if !refOK || string(pv.Spec.PersistentVolumeReclaimPolicy) != pv.Annotations[moveapi.AnnReclaimPolicy] {
		pv = pv.DeepCopy()
		if !refOK {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: mv.ns, Name: mv.name}
		}
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(pv.Annotations[moveapi.AnnReclaimPolicy])
		if pv, err = m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("pre-binding PV %s to claim %s/%s again: %w", mv.pv.Name, mv.ns, mv.name, err)
		}
		mv.pv = pv
	}
	if apierrors.IsNotFound(err) {
		c, err := claimToMakeAgain(pv, pv.Name)
		if err != nil {
			return 0, fmt.Errorf("the saved claim %s/%s on PV %s: %w", mv.ns, mv.name, pv.Name, err)
		}
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("making claim %s/%s again: %w", mv.ns, mv.name, err)
		}
		return m.cfg.Poll, nil
	}
	if claim.Spec.VolumeName != pv.Name || claim.Status.Phase != corev1.ClaimBound {
		if claim.Spec.VolumeName != "" && claim.Spec.VolumeName != pv.Name {
			m.wait(ctx, mv, fmt.Sprintf("claim %s/%s is bound to %s, not to its old volume %s", mv.ns, mv.name, claim.Spec.VolumeName, pv.Name))
		}
		return m.cfg.Poll, nil
	}
	// The target and seed go only if the old volume is there to hold the data.
	bad, err := m.vouchOld(ctx, pv)
	if err != nil {
		return 0, err
	}
	if bad != "" {
		return 0, m.park(ctx, mv, "rolling back to the old volume, but "+bad)
	}
	if err := m.deleteTarget(ctx, pv); err != nil {
		if !errors.Is(err, errTargetAway) || attempt < maxSeedRetries {
			m.wait(ctx, mv, "rolling back: "+err.Error())
			return 0, err
		}
		klog.FromContext(ctx).Info("Leaving the target on its node, which is away; the next move there deletes it", "err", err.Error())
		m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonRolledBack, fmt.Sprintf("Left the target volume %s on node %s, which does not answer: the next move to that node deletes it, and carve controller's audit reports it until then (%v)",
			pv.Annotations[moveapi.AnnTargetID], mv.to, err))
		if err := m.deleteSeed(ctx, pv); err != nil {
			return 0, err
		}
	}
	why := strings.TrimPrefix(pv.Annotations[moveapi.AnnAbort], abortFailed)
	pv = pv.DeepCopy()
	for k := range pv.Annotations {
		if strings.HasPrefix(k, moveapi.AnnPrefix) {
			delete(pv.Annotations, k)
		}
	}
	if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("clearing the move from PV %s: %w", pv.Name, err)
	}
	msg := fmt.Sprintf("Move to node %s rolled back (%s); the claim is bound to its old volume %s on node %s again", mv.to, why, pv.Name, pinnedFrom(pv, m.cfg.TopologyKey))
	m.cfg.Events.Event(claim, corev1.EventTypeWarning, moveapi.ReasonRolledBack, msg)
	m.cfg.Events.Event(pv, corev1.EventTypeWarning, moveapi.ReasonRolledBack, msg)
	m.moves.WithLabelValues(ResultRolledBack).Inc()
	klog.FromContext(ctx).Info("Move rolled back", "why", why)
	// A claim never deleted still asks; one made again does not.
	return 0, m.dropRequest(ctx, mv.ns, mv.name, claim.UID)
}
